"""One Generate request's stream to Triton's ensemble, shared by the gRPC service and the HTTP API.

``Generation(upstream, request, rid, closer).responses(metadata, timeout)`` writes the one
``ModelInferRequest`` that ``mapping.build_infer_request`` makes of a ``GenerateRequest``, then yields
the ``GenerateResponse``s that ``mapping.ResponseAssembler`` makes of the ensemble's answers; every
failure is raised as ``mapping.UpstreamError``. When the consumer stops early (a deadline, a client
that went away) the upstream stream is cancelled, which makes Triton cancel the request and the
engine free its KV blocks; a finished request's stream is handed to ``closer`` to be half-closed in
the background (``StreamCloser``).
"""
from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator

import grpc

from triton_llm.v1 import llm_service_pb2 as pb

from . import mapping
from .upstream import TritonUpstream

log = logging.getLogger("gateway")

DRAIN_TIMEOUT_S = 30.0  # how long a finished request's upstream stream may take to close before it is cancelled


class StreamCloser:
    """Half-closes finished upstream streams in the background, without delaying the caller."""

    def __init__(self, drain_timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        self.drain_timeout_s = drain_timeout_s
        self._closing: set[asyncio.Task] = set()

    def release(self, call) -> None:
        task = asyncio.get_running_loop().create_task(self._half_close(call, self.drain_timeout_s))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _half_close(call, timeout: float) -> None:
        """Half-close and wait for Triton to end the stream (it does once the request is complete).

        Not a cancel: on Triton 2.51, cancelling the stream right after the ensemble's *error* response
        can leave the ensemble counting a request in flight (its shutdown then waits out the exit
        timeout); a half-close lets Triton finish its bookkeeping first."""
        try:
            await call.done_writing()

            async def drain():
                while await call.read() is not grpc.aio.EOF:
                    pass
            await asyncio.wait_for(drain(), timeout)
        except asyncio.TimeoutError:
            log.warning("Triton did not close a finished request's stream within %.0fs; cancelling it", timeout)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        finally:
            if not call.done():
                call.cancel()


class Generation:
    """The upstream side of one request; ``assembler`` holds its usage once ``responses`` is done."""

    def __init__(self, upstream: TritonUpstream, request: pb.GenerateRequest, request_id: str,
                 closer: StreamCloser) -> None:
        self.upstream = upstream
        self.request = request
        self.request_id = request_id
        self.closer = closer
        self.infer_request = mapping.build_infer_request(request, request_id, upstream.model)  # FieldError
        self.assembler = mapping.ResponseAssembler(request_id)

    async def responses(self, metadata: tuple[tuple[str, str], ...] = (), timeout: float | None = None
                        ) -> AsyncIterator[pb.GenerateResponse]:
        rid = self.request_id
        call = self.upstream.stub.ModelStreamInfer(metadata=metadata or None, timeout=timeout)
        assembler = self.assembler
        error: mapping.UpstreamError | None = None
        ended = False  # Triton has ended the request (final response or error response)
        try:
            await call.write(self.infer_request)
            while not assembler.finished:
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    error = mapping.UpstreamError(grpc.StatusCode.UNAVAILABLE,
                                                  f"Triton closed the stream early; retry (request id {rid})")
                    break
                if resp.error_message:
                    ended = True
                    error = mapping.map_triton_error(resp.error_message, self.request, rid)
                    if error.code == grpc.StatusCode.INTERNAL:
                        log.error("request %s: ensemble error: %s", rid, resp.error_message)
                    break
                out = assembler.on_response(resp.infer_response)
                ended = assembler.finished
                if out is not None:
                    yield out
        except mapping.UpstreamError as e:
            log.error("request %s: %s", rid, e.message)
            error = e
        except grpc.aio.AioRpcError as e:
            error = mapping.map_rpc_error(e.code(), e.details() or "", rid, self.upstream.url)
            if error.code == grpc.StatusCode.INTERNAL:
                log.error("request %s: upstream gRPC error %s: %s", rid, e.code().name, e.details())
        finally:
            if ended:
                self.closer.release(call)
            elif not call.done():
                # Deadline, client cancellation or a broken stream: cancelling the upstream stream makes
                # Triton cancel the request, and the engine frees its KV blocks.
                call.cancel()
        if error is not None:
            raise error
