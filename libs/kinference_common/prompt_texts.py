"""What of an OpenAI-style body a classifier reads.

:func:`texts_from_body` turns a chat or legacy-completions body into the
``texts``/``roles``/``unreadable`` of a :class:`ClassifyRequest`:

- chat ``messages`` of every role: string ``content``, the ``text`` of each
  text part of multi-part content (``text``/``input_text``/``output_text``,
  and ``refusal``), the ``arguments`` of tool and function calls (model
  output the client sends back, which often carries what a tool returned) and
  a message's ``name``;
- legacy ``prompt`` (a string or a list of strings) and ``suffix``;
- parts that are not text (``image_url``, ``input_audio``, ``file``) and
  token-id prompts (lists of integers) are counted in ``unreadable``: a
  classifier cannot say they are clean, so one that finds nothing answers
  its "unknown" tag.

Anything else in the body (model, sampling parameters, tool schemas) is the
caller's configuration, not content, and is not read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})


@dataclass(slots=True)
class Extracted:
    texts: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)
    unreadable: int = 0

    def add(self, text: Any, role: str) -> None:
        if isinstance(text, str):
            if text:
                self.texts.append(text)
                self.roles.append(role)
        elif text is not None:
            self.unreadable += 1


def _content(out: Extracted, content: Any, role: str) -> None:
    if content is None:
        return
    if isinstance(content, str):
        out.add(content, role)
        return
    if not isinstance(content, list):
        out.unreadable += 1
        return
    for part in content:
        if isinstance(part, str):
            out.add(part, role)
        elif isinstance(part, dict):
            kind = part.get("type")
            if kind in _TEXT_PART_TYPES or (kind is None and "text" in part):
                out.add(part.get("text"), role)
            elif kind == "refusal":
                out.add(part.get("refusal"), role)
            else:
                out.unreadable += 1
        else:
            out.unreadable += 1


def _prompt(out: Extracted, prompt: Any) -> None:
    if prompt is None:
        return
    if isinstance(prompt, str):
        out.add(prompt, "")
        return
    if isinstance(prompt, list):
        for item in prompt:
            if isinstance(item, str):
                out.add(item, "")
            else:  # token ids, or a list of them
                out.unreadable += 1
        return
    out.unreadable += 1


def texts_from_body(body: dict[str, Any]) -> Extracted:
    """The texts of a chat or completions body, with their roles."""
    out = Extracted()
    messages = body.get("messages")
    if isinstance(messages, list):
        for msg in messages:
            if not isinstance(msg, dict):
                out.unreadable += 1
                continue
            role = msg.get("role") if isinstance(msg.get("role"), str) else ""
            _content(out, msg.get("content"), role)
            if isinstance(msg.get("name"), str):
                out.add(msg["name"], role)
            calls = msg.get("tool_calls")
            if isinstance(calls, list):
                for call in calls:
                    fn = call.get("function") if isinstance(call, dict) else None
                    if isinstance(fn, dict):
                        out.add(fn.get("arguments"), role)
            fn = msg.get("function_call")
            if isinstance(fn, dict):
                out.add(fn.get("arguments"), role)
    elif messages is not None:
        out.unreadable += 1
    _prompt(out, body.get("prompt"))
    if isinstance(body.get("suffix"), str):
        out.add(body["suffix"], "")
    return out
