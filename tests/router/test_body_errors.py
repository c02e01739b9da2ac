"""The 400 for an empty body says the body is empty (the trial got "body is
not JSON: Input data was truncated" from `curl -d ''`)."""

from __future__ import annotations

import pytest

from kinference_router.body import BadRequest, decode, parse


@pytest.mark.parametrize("data", [b"", b"  \n\t"])
def test_an_empty_body_is_named_empty(data: bytes) -> None:
    for call in (lambda: parse(data, chat=True), lambda: decode(data)):
        with pytest.raises(BadRequest) as err:
            call()
        assert str(err.value).startswith("body is empty"), err.value
        assert "truncated" not in str(err.value)


def test_a_truncated_body_is_still_not_json() -> None:
    with pytest.raises(BadRequest) as err:
        parse(b'{"model": "m", "messages": [', chat=True)
    assert str(err.value).startswith("body is not JSON: "), err.value
