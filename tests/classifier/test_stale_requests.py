"""Review of the change where a classify request older than its deadline plus
CLOCK_SKEW_ALLOWANCE is answered with the failure tag, outcome "deadline",
without running a detector): what a buggy or hostile peer can put in
``sentAt``/``deadlineMs`` over NATS. All ``# guard``: the handler never
crashes, never fails open, and classifies what it should."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from kinference_classifier.core import Classifiers
from kinference_classifier.pii import TAGS as PII_TAGS
from kinference_classifier.service import ClassifierService
from kinference_common.messages import ClassifyReply, decoder
from kinference_common.natsserver import NatsServer
from kinference_common.subjects import classify_subject
from nats.aio.client import Client as NATS

from .fakes import CountingDetector

pytestmark = pytest.mark.nats


@pytest.fixture
async def counting(nats_server: NatsServer) -> AsyncIterator[CountingDetector]:
    det = CountingDetector()
    svc = ClassifierService(nats_url=nats_server.url, health_host="127.0.0.1", health_port=0, names=["pii"],
                            classifiers=Classifiers(detectors=[det]))
    async with svc:
        det.ran = 0  # start() warms the detector up once
        yield det


async def ask(nc: NATS, raw: bytes) -> ClassifyReply:
    msg = await nc.request(classify_subject("pii"), raw, timeout=3.0)
    return decoder(ClassifyReply).decode(msg.data)


@pytest.mark.parametrize("sent_at", ["-1e308", "1e308", "0", "-0.0", "99999999999999999999999999", "1e-320"])
async def test_extreme_sent_at_is_answered_and_never_fails_open(counting: CountingDetector, nc: NATS, sent_at: str) -> None:  # guard
    raw = b'{"texts":["hello"],"deadlineMs":20,"sentAt":' + sent_at.encode() + b"}"
    reply = await ask(nc, raw)
    assert len(reply.tags) == 1 and reply.tags[0] in PII_TAGS.values()
    if float(sent_at) > time.time():  # a clock far ahead: no expiry, classified
        assert (reply.tags, reply.outcome) == (["pii-none"], "ok")
    else:  # long expired: the failure tag, never pii-none
        assert (reply.tags, reply.outcome) == (["pii-unknown"], "deadline")
    # the service is still answering
    assert (await ask(nc, b'{"texts":["hello"],"deadlineMs":20}')).outcome == "ok"


@pytest.mark.parametrize("sent_at", ["NaN", "Infinity", "-Infinity", "1e400", '"1"', "true"])
async def test_unrepresentable_sent_at_is_undecodable_and_fails_closed(counting: CountingDetector, nc: NATS,
                                                                      sent_at: str) -> None:  # guard
    raw = b'{"texts":["hello"],"deadlineMs":20,"sentAt":' + sent_at.encode() + b"}"
    reply = await ask(nc, raw)
    assert (reply.tags, reply.outcome) == (["pii-unknown"], "error")
    assert counting.ran == 0


async def test_no_deadline_means_no_expiry_however_old(counting: CountingDetector, nc: NATS) -> None:  # guard
    raw = b'{"texts":["hello"],"sentAt":%d}' % (time.time() - 3600)
    assert (await ask(nc, raw)).outcome == "ok"
    assert counting.ran == 1


async def test_negative_deadline_fails_closed_without_sent_at(counting: CountingDetector, nc: NATS) -> None:  # guard
    reply = await ask(nc, b'{"texts":["hello"],"deadlineMs":-5000}')
    assert (reply.tags, reply.outcome) == (["pii-unknown"], "deadline")


async def test_stale_requests_run_no_detector_and_are_counted(counting: CountingDetector, nc: NATS) -> None:  # guard
    old = time.time() - 10
    for _ in range(3):
        reply = await ask(nc, b'{"texts":["hello"],"deadlineMs":20,"sentAt":%f,"requestId":"r"}' % old)
        assert (reply.tags, reply.outcome, reply.request_id) == (["pii-unknown"], "deadline", "r")
    assert counting.ran == 0
    # within the allowance (deadline 20 ms + 1 s): classified
    assert (await ask(nc, b'{"texts":["hello"],"deadlineMs":20,"sentAt":%f}' % (time.time() - 0.9))).outcome == "ok"
    assert counting.ran == 1
