"""No service user can make a JetStream stream capture the classify
subjects (which carry prompts) and read them back: the KV owners may create
their bucket's stream but never change its subjects."""

from __future__ import annotations

import asyncio

import pytest

from kinference_common import subjects
from tests.classifier.test_burst_nats_auth import login, server  # noqa: F401 - fixture

pytestmark = pytest.mark.nats


@pytest.mark.parametrize("user,bucket", [("policy-compiler", subjects.CONFIG_BUCKET),
                                         ("telemetry-collector", subjects.TELEMETRY_BUCKET)])
async def test_a_kv_owner_cannot_make_its_stream_capture_prompts(server, user: str, bucket: str) -> None:  # noqa: F811
    url, auth = server
    owner = await login(url, auth, user)
    router = await login(url, auth, "router")
    try:
        js = owner.jetstream(timeout=1)
        await js.create_key_value(bucket=bucket)  # what the service does at start: allowed
        stream = f"KV_{bucket}"
        config = (await js.stream_info(stream)).config
        config.subjects = [*config.subjects, f"{subjects.CLASSIFY_PREFIX}.>"]
        with pytest.raises(Exception):
            await js.update_stream(config)
        await router.publish(f"{subjects.CLASSIFY_PREFIX}.pii", b'{"texts": ["4111 1111 1111 1111"]}')
        await router.flush()
        await asyncio.sleep(0.1)
        assert (await js.stream_info(stream)).config.subjects == [f"$KV.{bucket}.>"]
        with pytest.raises(Exception):
            await js.get_last_msg(stream, f"{subjects.CLASSIFY_PREFIX}.pii")
    finally:
        await owner.close()
        await router.close()
