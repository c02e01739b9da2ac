"""The router's batcher (services/router/classification.py) trusts a batch
reply only item by item: a reply that is not the answer for that item gets
the classifier's failure tag."""

from __future__ import annotations

import asyncio
from typing import Any

import nats

from kinference_common.messages import ClassifyBatch, ClassifyBatchReply, ClassifyReply, decoder, encode
from kinference_common.subjects import classify_batch_subject
from kinference_router.classification import Batcher

CARD = "My card is 4111 1111 1111 1111."
CLEAN = "Write a haiku about autumn leaves."


def body(text: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


async def serve(nc: Any, reorder: bool) -> None:
    dec = decoder(ClassifyBatch)

    async def answer(msg: Any) -> None:
        batch = dec.decode(msg.data)
        replies = [ClassifyReply(classifier="pii", tags=["pii-confirmed" if "4111" in "".join(it.texts)
                                                         else "pii-none"], request_id=it.request_id)
                   for it in batch.items]
        await msg.respond(encode(ClassifyBatchReply(replies=replies[::-1] if reorder else replies)))

    await nc.subscribe(classify_batch_subject("pii"), cb=answer)
    await nc.flush()


async def test_replies_in_order_are_taken(nats_server: Any) -> None:
    nc = await nats.connect(nats_server.url)
    await serve(nc, reorder=False)
    try:
        b = Batcher(lambda: nc)
        card, clean = await asyncio.gather(b.classify("pii", body(CARD), "req-card"),
                                           b.classify("pii", body(CLEAN), "req-clean"))
        assert (card.tags, clean.tags) == (["pii-confirmed"], ["pii-none"])
    finally:
        await nc.close()


async def test_replies_in_the_wrong_order_fail_closed(nats_server: Any) -> None:
    """A classifier (a buggy replica, a replayed message) answers the items
    of a batch in the wrong order: the card's item must not get the clean
    item's ``pii-none``."""
    nc = await nats.connect(nats_server.url)
    await serve(nc, reorder=True)
    try:
        b = Batcher(lambda: nc)
        card, clean = await asyncio.gather(b.classify("pii", body(CARD), "req-card"),
                                           b.classify("pii", body(CLEAN), "req-clean"))
        assert card.tags == ["pii-unknown"] and card.outcome == "error"
        assert clean.tags == ["pii-unknown"] and clean.outcome == "error"
    finally:
        await nc.close()


async def test_a_failed_reply_with_a_clean_tag_fails_closed(nats_server: Any) -> None:
    """A reply that says the classifier failed (outcome not ok) but carries a
    tag other than the failure tag contradicts itself: the failure tag."""
    nc = await nats.connect(nats_server.url)
    dec = decoder(ClassifyBatch)

    async def answer(msg: Any) -> None:
        batch = dec.decode(msg.data)
        await msg.respond(encode(ClassifyBatchReply(replies=[
            ClassifyReply(classifier="pii", tags=["pii-none"], outcome="deadline", request_id=it.request_id)
            for it in batch.items])))

    await nc.subscribe(classify_batch_subject("pii"), cb=answer)
    await nc.flush()
    try:
        reply = await Batcher(lambda: nc).classify("pii", body(CARD), "req-card")
        assert reply.tags == ["pii-unknown"]
    finally:
        await nc.close()
