"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with the HTTP status.

``APIError`` is raised by the handlers; ``install`` makes FastAPI answer its own validation errors
(422 by default) as a 400 naming the field in ``param``, and any other exception as a 500 that names
only the request id. ``from_upstream`` turns the gRPC status of a failed upstream call into its HTTP
equivalent (400 for a bad field, 503 while Triton is unavailable, 504 on a deadline).
"""
from __future__ import annotations

import logging

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from gateway.mapping import UpstreamError

log = logging.getLogger("gateway")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error",
          503: "service_unavailable", 504: "timeout"}
_HTTP_FOR_CODE = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.FAILED_PRECONDITION: 400,
                  grpc.StatusCode.OUT_OF_RANGE: 400, grpc.StatusCode.UNAVAILABLE: 503,
                  grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.DEADLINE_EXCEEDED: 504,
                  grpc.StatusCode.CANCELLED: 499}


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param=param, code="invalid_value")


def from_upstream(e: UpstreamError, param_of: dict[str, str] | None = None) -> APIError:
    """``param_of`` renames the proto field the error names to the OpenAI parameter that set it."""
    status = _HTTP_FOR_CODE.get(e.code, 500)
    if e.field is not None:
        param = (param_of or {}).get(e.field, e.field)
        message = e.message.replace(f"{e.field}:", f"{param}:", 1)
        return APIError(400, message, param=param, code="invalid_value")
    retry = f"{max(1, round(e.retry_after_s))}" if e.retry_after_s is not None else "1"
    headers = {"Retry-After": retry} if status in (429, 503) else None
    code = {429: "rate_limit_exceeded", 503: "model_not_ready"}.get(status)
    return APIError(status, e.message, code=code, headers=headers)


def loc_path(loc: tuple) -> str:
    """pydantic's ``("body", "messages", 0, "role")`` -> ``messages[0].role``."""
    out = ""
    for part in loc:
        if part == "body" and not out:
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith(("function-", "literal[", "list[", "str", "int", "dict[")):
            continue      # the branch of a union pydantic tried, not a field
        else:
            out += ("." if out else "") + str(part)
    return out or "body"


def install(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError) -> JSONResponse:
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError) -> JSONResponse:
        errors = e.errors()
        first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
        param = loc_path(tuple(first.get("loc", ("body",))))
        if first.get("type") == "json_invalid":
            param = "body"
        message = f"{param}: {first.get('msg', 'invalid value')}"
        if first.get("type") == "extra_forbidden":
            message = f"{param}: unknown parameter"
        return APIError(400, message, param=param, code="invalid_value").response()

    @app.exception_handler(HTTPException)
    async def _http(request: Request, e: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        return APIError(e.status_code, str(e.detail), code=code).response()

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception) -> JSONResponse:
        rid = request.headers.get("x-request-id", "")
        log.exception("HTTP %s %s failed", request.method, request.url.path)
        return APIError(500, f"internal error{f' (request id {rid})' if rid else ''}").response()
