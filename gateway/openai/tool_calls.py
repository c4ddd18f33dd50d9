"""One choice's output read as OpenAI's message: content, or tool calls (guides.py says which).

``ChoiceReader(plan).feed(text)`` returns the deltas to stream for a piece of output and
``finish()`` the rest; ``message()`` is the whole assistant message (non-streamed). Tool calls are
streamed as OpenAI streams them: the first delta of a call carries its ``index``, ``id``, ``type``
and ``name`` with empty ``arguments``, the next ones argument text. In ``auto`` mode, text that could
begin ``<tool_call>`` is held back until it is known not to; a call found is parsed at the end.
"""
from __future__ import annotations

import json
import re
import uuid

from .guides import OutputPlan
from .prompt import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

_REQUIRED_HEAD = re.compile(r'^\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
_AUTO_CALL = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + r"|$)", re.S)


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def held_prefix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


def parse_auto_calls(text: str, names: tuple[str, ...]) -> tuple[str, list[tuple[str, str]]]:
    """(content before the first call, [(name, arguments JSON)]); no valid call: (text, [])."""
    start = text.find(TOOL_CALL_OPEN)
    if start < 0:
        return text, []
    calls = []
    for m in _AUTO_CALL.finditer(text, start):
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("name") in names and isinstance(obj.get("arguments", {}), dict):
            calls.append((obj["name"], json.dumps(obj.get("arguments", {}), ensure_ascii=False)))
    if not calls:
        return text, []
    return text[:start].strip(), calls


def _call_delta(index: int, cid: str | None, name: str | None, arguments: str) -> dict:
    call: dict = {"index": index}
    if cid is not None:
        call.update(id=cid, type="function")
    function = {"arguments": arguments} if name is None else {"name": name, "arguments": arguments}
    call["function"] = function
    return {"tool_calls": [call]}


class ChoiceReader:
    def __init__(self, plan: OutputPlan) -> None:
        self.plan = plan
        self.text = ""
        self.sent = 0              # characters of ``text`` (or of the arguments) already streamed
        self.cid = call_id()
        self.name = plan.tool if plan.mode == "named" else ""
        self.head = False          # the call's header delta is out
        self.args_start = -1       # required mode: where the arguments begin in ``text``
        self.called = False

    # ---- streaming ------------------------------------------------------------------------------
    def feed(self, piece: str) -> list[dict]:
        self.text += piece
        mode = self.plan.mode
        if mode == "text":
            return self._content(len(self.text))
        if mode == "named":
            return self._arguments(0, len(self.text))
        if mode == "required":
            if self.args_start < 0:
                m = _REQUIRED_HEAD.match(self.text)
                if m is None:
                    return []
                self.name, self.args_start = json.loads(f'"{m.group(1)}"'), m.end()
                self.sent = m.end()
            tail = self.args_start + len(self.text[self.args_start:].rstrip("} \n"))   # may close the wrapper
            return self._arguments(self.args_start, max(tail, self.sent))
        if TOOL_CALL_OPEN in self.text:      # auto: the rest is read at the end
            return self._content(self.text.index(TOOL_CALL_OPEN))
        return self._content(len(self.text) - held_prefix(self.text, TOOL_CALL_OPEN))

    def finish(self) -> list[dict]:
        mode = self.plan.mode
        if mode == "text":
            return self._content(len(self.text))
        if mode == "named":
            return self._arguments(0, len(self.text)) if self.head else [self._header()]
        if mode == "required":
            if self.args_start < 0:
                return self._content(len(self.text))   # cut before the name was complete
            body = self.text.rstrip()
            end = len(body) - 1 if body.endswith("}") and self._closed() else len(self.text)
            return self._arguments(self.args_start, max(end, self.sent))
        unsent = self.text[self.sent:]
        content, calls = parse_auto_calls(unsent, self.plan.tools) if TOOL_CALL_OPEN in unsent else (unsent, [])
        calls = calls[:1] if self.plan.single_call else calls
        out = [{"content": content}] if content else []
        for i, (name, args) in enumerate(calls):
            out += [_call_delta(i, call_id(), name, ""), _call_delta(i, None, None, args)]
        self.called = bool(calls)
        self.sent = len(self.text)
        return out

    def _closed(self) -> bool:
        try:
            json.loads(self.text)
            return True
        except ValueError:
            return False

    def _content(self, upto: int) -> list[dict]:
        if upto <= self.sent:
            return []
        piece, self.sent = self.text[self.sent:upto], upto
        return [{"content": piece}]

    def _header(self) -> dict:
        self.head = self.called = True
        return _call_delta(0, self.cid, self.name, "")

    def _arguments(self, start: int, upto: int) -> list[dict]:
        out = [] if self.head else [self._header()]
        self.sent = max(self.sent, start)
        if upto > self.sent:
            out.append(_call_delta(0, None, None, self.text[self.sent:upto]))
            self.sent = upto
        return out

    # ---- whole ----------------------------------------------------------------------------------
    def message(self) -> dict:
        """The assistant message for the whole output (``feed`` every piece first, no ``finish``)."""
        mode, text = self.plan.mode, self.text
        calls: list[tuple[str, str]] = []
        content: str | None = text
        if mode == "named":
            calls, content = [(self.plan.tool, text)], None
        elif mode == "required":
            try:
                obj = json.loads(text)
                calls, content = [(obj["name"], json.dumps(obj["arguments"], ensure_ascii=False))], None
            except (ValueError, KeyError, TypeError):
                pass           # cut by max_tokens: the text as it is, finish_reason length
        elif mode == "auto":
            content, calls = parse_auto_calls(text, self.plan.tools)
            calls = calls[:1] if self.plan.single_call else calls
            content = content or None
        self.called = bool(calls)
        msg: dict = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = [{"id": call_id(), "type": "function", "function": {"name": n, "arguments": a}}
                                 for n, a in calls]
        return msg

    def finish_reason(self, engine_reason: str) -> str:
        """OpenAI's finish reason: ``length`` when cut, ``tool_calls`` for a chosen call, else ``stop``."""
        if engine_reason == "length":
            return "length"
        if self.called and self.plan.mode in ("required", "auto"):
            return "tool_calls"
        return "stop"
