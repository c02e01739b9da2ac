"""The client's model name put back in an answer (services/router/model_name.py),
shared by the data port and the Endpoint Picker: whole, or streamed in
chunks cut anywhere."""

from __future__ import annotations

from kinference_router.model_name import Restorer

SERVED = "Qwen/Qwen2.5-32B-Instruct"
EVENT = b'data: {"id":"1","model":"Qwen/Qwen2.5-32B-Instruct","choices":[{"delta":{"content":"Hi"},"index":0}]}\n\n'
SPACED = b'data: {"id": "1", "model": "Qwen/Qwen2.5-32B-Instruct", "choices": []}\r\n\r\n'
DONE = b"data: [DONE]\n\n"


def test_the_clients_name_is_put_back_whatever_the_chunking() -> None:
    stream = EVENT + SPACED + EVENT + DONE
    want = stream.replace(b'"Qwen/Qwen2.5-32B-Instruct"', b'"qwen-2.5"')
    for size in (1, 3, 7, 40, 100, len(stream)):
        r = Restorer.of(SERVED, "qwen-2.5")
        assert r is not None
        out = b"".join(r.feed(stream[i:i + size]) for i in range(0, len(stream), size)) + r.flush()
        assert out == want, size
    # a whole event goes at once, never held
    r = Restorer.of(SERVED, "qwen-2.5")
    assert r is not None and r.feed(EVENT) == EVENT.replace(b"Qwen/Qwen2.5-32B-Instruct", b"qwen-2.5")


def test_only_the_served_name_in_a_model_field_changes() -> None:
    assert Restorer.of("m", "m") is None  # nothing to do: nothing done
    r = Restorer.of("m", 'my "m"')
    assert r is not None
    whole = b'{"model": "m", "choices": [{"message": {"content": "\\"model\\": \\"m\\""}}], "x": {"model": "m2"}}'
    assert r.whole(whole) == whole.replace(b'"model": "m",', b'"model": "my \\"m\\"",', 1)


def test_a_line_that_never_ends_is_not_held_without_bound() -> None:
    r = Restorer.of("m", "n")
    assert r is not None
    out = r.feed(b'{"model":"m", "pad": "' + b"x" * 100_000)
    assert out.startswith(b'{"model":"n"')
    assert out + r.feed(b'"}') + r.flush() == b'{"model":"n", "pad": "' + b"x" * 100_000 + b'"}'
