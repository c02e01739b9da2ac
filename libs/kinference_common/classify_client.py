"""The caller's side: ask a classifier over NATS, never fail open.

:func:`classify` is what the router calls for each required classifier. It
always returns a :class:`ClassifyReply` with exactly one tag of that
classifier: the service's answer, or the classifier's ``failure_tag`` (from
:mod:`kinference_common.classifiers`) when

- the texts are over the size cap (not sent; ``outcome="oversize"``);
- nobody subscribes (``"error"``, detail ``no responders``), NATS is
  disconnected or closed, or publishing fails;
- no answer arrives within the deadline (``"deadline"``);
- the answer does not decode or does not carry exactly one of the
  classifier's tags (``"error"``).

It raises only for a programming error: a classifier name that is not built in.
:func:`classify_body` does the same for an OpenAI-style request body.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgspec
import nats.errors
from kinference_common.classifiers import DEFAULT_MAX_CHARS
from kinference_common.prompt_texts import texts_from_body
from kinference_common.classifiers import BUILTIN_CLASSIFIERS
from kinference_common.messages import ClassifyReply, ClassifyRequest, decoder, encode
from kinference_common.subjects import classify_subject
from nats.aio.client import Client as NATS

_reply_decoder = decoder(ClassifyReply)

#: share of the deadline the service may spend working; the rest is transit
SERVICE_SHARE = 0.8


def failure(
    classifier: str, outcome: str, detail: str, started: float, request_id: str = ""
) -> ClassifyReply:
    """The failure reply a caller acts on when the classifier could not answer."""
    info = BUILTIN_CLASSIFIERS[classifier]
    return ClassifyReply(
        classifier=classifier,
        tags=[info.failure_tag],
        outcome=outcome,  # type: ignore[arg-type]
        micros=round((time.perf_counter() - started) * 1e6, 1),
        request_id=request_id,
        detail=detail,
    )


async def classify(
    nc: NATS | None,
    classifier: str,
    texts: Sequence[str],
    deadline: float | None = None,
    *,
    roles: Sequence[str] = (),
    unreadable: int = 0,
    request_id: str = "",
    max_chars: int = DEFAULT_MAX_CHARS,
) -> ClassifyReply:
    """Ask ``classifier`` about ``texts``; wait at most ``deadline`` seconds.

    ``deadline`` defaults to the classifier's ``deadline_seconds``.
    """
    info = BUILTIN_CLASSIFIERS.get(classifier)
    if info is None:
        raise KeyError(f"unknown classifier {classifier!r}")
    started = time.perf_counter()
    timeout = info.deadline_seconds if deadline is None else deadline
    if sum(len(t) for t in texts) > max_chars:
        return failure(classifier, "oversize", "over the size cap, not sent", started, request_id)
    if nc is None or not nc.is_connected:
        return failure(classifier, "error", "not connected to NATS", started, request_id)
    if timeout <= 0:
        return failure(classifier, "deadline", "no time left", started, request_id)
    payload = encode(
        ClassifyRequest(
            texts=list(texts),
            deadline_ms=timeout * 1000.0 * SERVICE_SHARE,
            request_id=request_id,
            roles=list(roles),
            unreadable=unreadable,
            sent_at=time.time(),
        )
    )
    try:
        msg = await nc.request(classify_subject(classifier), payload, timeout=timeout)
    except nats.errors.NoRespondersError:
        return failure(classifier, "error", "no responders", started, request_id)
    except nats.errors.TimeoutError:
        return failure(classifier, "deadline", "no answer within the deadline", started, request_id)
    except Exception as exc:  # connection closed, payload too large, ...
        return failure(classifier, "error", type(exc).__name__, started, request_id)
    try:
        reply = _reply_decoder.decode(msg.data)
    except msgspec.DecodeError:
        return failure(classifier, "error", "undecodable reply", started, request_id)
    if (len(reply.tags) != 1 or reply.tags[0] not in info.tags or reply.classifier != classifier
            or (reply.outcome != "ok" and reply.tags[0] != info.failure_tag)):  # a failure says its failure tag
        return failure(classifier, "error", "invalid reply", started, request_id)
    return reply


async def classify_body(
    nc: NATS | None,
    classifier: str,
    body: dict[str, Any],
    deadline: float | None = None,
    *,
    request_id: str = "",
    max_chars: int = DEFAULT_MAX_CHARS,
) -> ClassifyReply:
    """:func:`classify` on what :func:`~kinference_common.prompt_texts.texts_from_body`
    reads of an OpenAI-style body (every role, text parts, legacy prompts)."""
    extracted = texts_from_body(body)
    return await classify(
        nc,
        classifier,
        extracted.texts,
        deadline,
        roles=extracted.roles,
        unreadable=extracted.unreadable,
        request_id=request_id,
        max_chars=max_chars,
    )
