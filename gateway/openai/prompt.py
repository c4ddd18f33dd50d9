"""The chat messages the model's template renders: OpenAI's roles and tool turns as plain text messages.

- ``developer`` becomes ``system``; content parts are joined into one string;
- an assistant turn's ``tool_calls`` are written after its text in the documented text format,
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes-style), one per call;
- a ``tool`` turn keeps its role, its content wrapped as ``<tool_response>...</tool_response>``;
- when tools may be called, a system message lists them (``<tools>[...]</tools>``) and states the
  format; it is put first, joined to the request's own system message when there is one.
"""
from __future__ import annotations

import json

from .schemas import ChatCompletionRequest, Message, Tool

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


def tool_call_text(name: str, arguments: str) -> str:
    try:
        args = json.loads(arguments)
    except ValueError:
        args = arguments
    return TOOL_CALL_OPEN + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + TOOL_CALL_CLOSE


def tools_system_text(tools: list[Tool]) -> str:
    listed = [{"type": "function", "function": t.function.model_dump(exclude_none=True)} for t in tools]
    return ("You may call one of these functions. <tools>" + json.dumps(listed, ensure_ascii=False) + "</tools>\n"
            "To call one, answer with " + TOOL_CALL_OPEN + '{"name": <function name>, "arguments": <JSON object>}'
            + TOOL_CALL_CLOSE + ".")


def _converted(m: Message) -> Message:
    text = m.text()
    if m.role == "developer":
        return Message(role="system", content=text)
    if m.role == "assistant" and m.tool_calls:
        calls = "".join(tool_call_text(c.function.name, c.function.arguments) for c in m.tool_calls)
        return Message(role="assistant", content=text + calls)
    if m.role == "tool":
        return Message(role="tool", content=f"<tool_response>{text}</tool_response>")
    return Message(role=m.role, content=text)


def prompt_messages(body: ChatCompletionRequest) -> list[Message]:
    messages = [_converted(m) for m in body.messages]
    if body.tools and body.tool_choice != "none":
        intro = tools_system_text(body.tools)
        if messages[0].role == "system":
            messages[0] = Message(role="system", content=messages[0].text() + "\n\n" + intro)
        else:
            messages.insert(0, Message(role="system", content=intro))
    return messages
