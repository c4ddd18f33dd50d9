"""The soak's requests through the gateway (``python -m tools.soak --gateway``): a plan of tools/soak_mix.py as a
``triton_llm.v1.GenerateRequest`` on the gateway's LLMService, read to its end or cancelled mid-stream, classified
as the direct requests are (completed, cancelled, clean_error naming the proto field, unexpected_error, lost).
``generate_request`` returns None for a plan the typed API cannot express (``messages`` that is not JSON)."""
from __future__ import annotations

import json
import re
from typing import Any

from tools.soak_mix import Plan

FIELD_OF_INPUT = {"text_input": "prompt", "stop_words": "stop_words"}   # ensemble input -> proto field


def generate_request(plan: Plan):
    from triton_llm.v1 import llm_service_pb2 as pb

    if plan.raw:
        return None
    fields: dict[str, Any] = {}
    for name, value in plan.values.items():
        if name == "messages":
            try:
                messages = json.loads(value)
            except ValueError:
                return None
            fields["messages"] = pb.ChatMessages(messages=[pb.ChatMessage(**m) for m in messages])
        elif name == "stop_words":
            fields["stop_words"] = list(value)
        else:
            fields[FIELD_OF_INPUT.get(name, name)] = value
    return pb.GenerateRequest(**fields)


async def run_one(stub, plan: Plan, timeout: float) -> tuple[str, int, str]:
    """(outcome, responses seen, detail) of one plan sent through the gateway."""
    import grpc
    from triton_llm.v1 import llm_service_pb2 as pb

    call = stub.Generate(generate_request(plan), timeout=timeout)
    seen, finished = 0, False
    field = FIELD_OF_INPUT.get(plan.error_field or "", plan.error_field)
    try:
        async for resp in call:
            seen += 1
            finished = finished or resp.finish_reason != pb.FINISH_REASON_UNSPECIFIED
            if plan.kind == "cancel" and seen >= plan.cancel_after and not finished:
                call.cancel()
                return "cancelled", seen, ""
    except grpc.aio.AioRpcError as e:
        code, details = e.code(), e.details() or ""
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return "hung", seen, f"no end within {timeout:.0f} s"
        if plan.kind == "bad" and code == grpc.StatusCode.INVALID_ARGUMENT and re.match(rf"{field}: ", details):
            return "clean_error", seen, details
        return "unexpected_error", seen, f"{code.name}: {details}"
    if plan.kind == "bad":
        return "unexpected_error", seen, "a bad input was served"
    return ("completed", seen, "") if finished else ("lost", seen, "the stream ended without a finish reason")
