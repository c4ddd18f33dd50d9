"""``response_format`` and ``tool_choice`` as guided decoding: what the output must be, and how to read it.

| request | guide | the output is | finish |
| --- | --- | --- | --- |
| ``response_format: json_object`` | any JSON | the message content | stop / length |
| ``response_format: json_schema`` | that schema | the message content | stop / length |
| ``tool_choice: {function: f}`` | ``f``'s ``parameters`` | ``f``'s arguments | stop (as OpenAI) |
| ``tool_choice: required`` | ``anyOf`` of ``{"name": const f, "arguments": f's parameters}`` | one call | tool_calls |
| ``tool_choice: auto`` (or tools without a choice) | a structural tag: free text, each ``<tool_call>`` region one call as ``required`` | text; each ``<tool_call>{...}</tool_call>`` parsed | tool_calls |

The schemas are checked by the ensemble's preprocess (grammar/schema.py's allow-list); its error names
the keyword, and ``OutputPlan.param`` names the OpenAI parameter the guide came from.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from triton_llm.v1 import llm_service_pb2 as pb

from .errors import bad_request
from .prompt import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from .schemas import ChatCompletionRequest, Tool

ANY_OBJECT = {"type": "object"}


@dataclass(frozen=True)
class OutputPlan:
    """``mode``: text | named | required | auto; ``tool``: the named function; ``param``: where the guide came from."""

    mode: str = "text"
    guide: pb.GuidedDecoding | None = None
    tool: str = ""
    param: str = "response_format"
    tools: tuple[str, ...] = ()
    single_call: bool = False       # auto: keep the first call only (parallel_tool_calls: false)


def _parameters(tool: Tool) -> dict:
    return tool.function.parameters if tool.function.parameters else ANY_OBJECT


def _schema_guide(schema: dict) -> pb.GuidedDecoding:
    return pb.GuidedDecoding(json_schema=json.dumps(schema, ensure_ascii=False, separators=(",", ":")))


def required_schema(tools: list[Tool]) -> dict:
    """One call of any of ``tools``: ``{"name": <const>, "arguments": <its parameters>}``, name first."""
    branches = [{"type": "object",
                 "properties": {"name": {"const": t.function.name}, "arguments": _parameters(t)},
                 "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def auto_guide(tools: list[Tool]) -> pb.GuidedDecoding:
    """Free text; from ``<tool_call>`` on, one call of any of ``tools`` (``required_schema``), then the close tag."""
    tag = {"structures": [{"begin": TOOL_CALL_OPEN, "schema": required_schema(tools), "end": TOOL_CALL_CLOSE}],
           "triggers": [TOOL_CALL_OPEN]}
    return pb.GuidedDecoding(structural_tag=json.dumps(tag, ensure_ascii=False, separators=(",", ":")))


def plan(body: ChatCompletionRequest) -> OutputPlan:
    """The guide and the reading of the output for one chat request (``APIError`` 400 on a bad combination)."""
    tools = body.tools or []
    names = tuple(t.function.name for t in tools)
    if len(set(names)) != len(names):
        raise bad_request("tools", "function names must be unique")
    choice = body.tool_choice
    fmt = body.response_format
    wants_format = fmt is not None and fmt.type != "text"
    if tools and choice != "none":
        if wants_format:
            raise bad_request("response_format", "response_format cannot be combined with tools "
                                                 "(set tool_choice to none)")
        if choice is None or choice == "auto":
            return OutputPlan("auto", auto_guide(tools), param="tools", tools=names,
                              single_call=body.parallel_tool_calls is False)
        if choice == "required":
            return OutputPlan("required", _schema_guide(required_schema(tools)), param="tools", tools=names)
        name = choice.function.name
        match = [t for t in tools if t.function.name == name]
        if not match:
            raise bad_request("tool_choice.function.name", f"no tool named {name!r} in tools")
        index = names.index(name)
        return OutputPlan("named", _schema_guide(_parameters(match[0])), tool=name,
                          param=f"tools[{index}].function.parameters", tools=names)
    if not wants_format:
        return OutputPlan()
    if fmt.type == "json_object":
        return OutputPlan(guide=pb.GuidedDecoding(any_json=pb.GuidedDecoding.AnyJson()))
    schema = fmt.json_schema.schema_
    if not schema:
        raise bad_request("response_format.json_schema.schema", "required: the JSON schema to follow")
    return OutputPlan(guide=_schema_guide(schema), param="response_format.json_schema.schema")
