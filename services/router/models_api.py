"""``GET /v1/models`` and ``GET /v1/models/{id}``: the models the pool can
reach (its ``status.models[]``), in OpenAI's shape plus what Kinference knows
(aliases, the destinations serving each, the largest context window)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from kinference_common.compiled import PoolModel

PREFIX = "/v1/models/"


def model_object(m: PoolModel) -> dict[str, Any]:
    return {"id": m.name, "object": "model", "owned_by": "kinference", "aliases": m.aliases,
            "served_by": m.served_by, **({"max_model_len": m.context_window["max"]} if m.context_window else {})}


def model_list(models: list[PoolModel]) -> dict[str, Any]:
    return {"object": "list", "data": [model_object(m) for m in models]}


def find(models: list[PoolModel], path: str) -> PoolModel | None:
    """The model ``/v1/models/<id>`` names, by its name or one of its aliases
    (an id may hold ``/``, as ``Qwen/Qwen2.5-32B-Instruct``, written as is
    or percent-encoded)."""
    wanted = unquote(path[len(PREFIX):])
    return next((m for m in models if m.name == wanted), None) or \
        next((m for m in models if wanted in m.aliases), None)
