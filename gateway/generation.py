"""One Generate request's stream to Triton's ensemble, shared by the gRPC service and the HTTP API.

``Generation(upstream, request, rid, closer).responses(metadata, timeout)`` writes the one
``ModelInferRequest`` that ``mapping.build_infer_request`` makes of a ``GenerateRequest``, then yields
the ``GenerateResponse``s that ``mapping.ResponseAssembler`` makes of the ensemble's answers; every
failure is raised as ``mapping.UpstreamError``. Triton's stream is read at its own pace into a bounded
buffer, whatever the consumer's (``Generation``). When the consumer stops early (a deadline, a client
that went away) the upstream stream is cancelled and a ``stop`` request sent, so the engine frees the
request's KV blocks at once; a finished request's stream is handed to ``closer`` to be half-closed in
the background (``StreamCloser``).
"""
from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator

import grpc
from tritonclient.grpc import service_pb2

from triton_llm.v1 import llm_service_pb2 as pb

from . import mapping
from .stream_buffer import DEFAULT_CAP_BYTES, StreamBuffer
from .upstream import TritonUpstream

log = logging.getLogger("gateway")

DRAIN_TIMEOUT_S = 30.0  # how long a finished request's upstream stream may take to close before it is cancelled
STOP_TIMEOUT_S = 5.0    # how long the stop request of an abandoned request may take


class StreamCloser:
    """Half-closes finished upstream streams, and stops abandoned requests, in the background, without
    delaying the caller."""

    def __init__(self, drain_timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        self.drain_timeout_s = drain_timeout_s
        self._closing: set[asyncio.Task] = set()

    def _background(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def release(self, call) -> None:
        self._background(self._half_close(call, self.drain_timeout_s))

    def stop(self, upstream: TritonUpstream, request_id: str) -> None:
        """Send a ``stop`` request for ``request_id`` on a stream of its own (answered at once, closed once
        answered); a Triton that is gone is no error."""
        async def send() -> None:
            call = upstream.stub.ModelStreamInfer(timeout=STOP_TIMEOUT_S)
            try:
                await call.write(stop_request(request_id, upstream.model))
                resp = await call.read()
                if resp is not grpc.aio.EOF and resp.error_message:
                    log.warning("request %s: the stop request failed: %s", request_id, resp.error_message)
            except (grpc.aio.AioRpcError, asyncio.CancelledError):
                pass
            await self._half_close(call, STOP_TIMEOUT_S)
        self._background(send())

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


def stop_request(request_id: str, model: str) -> service_pb2.ModelInferRequest:
    """TensorRT-LLM's ``stop`` request for ``request_id``: the llm model aborts that request at once."""
    req = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    req.parameters["triton_enable_empty_final_response"].bool_param = True
    mapping.add_input(req, "text_input", "BYTES", [""])
    mapping.add_input(req, "max_tokens", "INT32", [1])
    mapping.add_input(req, "stop", "BOOL", [True])
    return req


class Generation:
    """The upstream side of one request; ``assembler`` holds its usage once ``responses`` is done.

    A pump task reads Triton's stream into a ``StreamBuffer`` (gateway/stream_buffer.py) whatever the
    consumer's pace; a consumer too slow for ``buffer_bytes`` ends with RESOURCE_EXHAUSTED. When the request
    is abandoned before Triton ended it (a deadline, a client gone, a full buffer), its upstream stream is
    cancelled and a ``stop`` request for its id is sent: Triton 2.51's ensemble does not mark the llm step
    already in flight cancelled, so without it the engine would hold the request's KV blocks until
    postprocess notices on a later response (or, for a request still waiting for a slot, until it runs).
    """

    def __init__(self, upstream: TritonUpstream, request: pb.GenerateRequest, request_id: str,
                 closer: StreamCloser, buffer_bytes: int = DEFAULT_CAP_BYTES) -> None:
        self.upstream = upstream
        self.request = request
        self.request_id = request_id
        self.closer = closer
        self.buffer_bytes = buffer_bytes
        self.infer_request = mapping.build_infer_request(request, request_id, upstream.model)  # FieldError
        self.assembler = mapping.ResponseAssembler(request_id)
        self.buffer: StreamBuffer | None = None

    async def responses(self, metadata: tuple[tuple[str, str], ...] = (), timeout: float | None = None
                        ) -> AsyncIterator[pb.GenerateResponse]:
        call = self.upstream.stub.ModelStreamInfer(metadata=metadata or None, timeout=timeout)
        buffer = self.buffer = StreamBuffer(self.buffer_bytes)
        pump = asyncio.get_running_loop().create_task(self._pump(call, buffer))
        try:
            while True:
                out = await buffer.get()
                if out is None:
                    return
                yield out
        finally:   # the consumer is done (or gone): so is the pump, which cleans up the upstream call
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)

    async def _pump(self, call, buffer: StreamBuffer) -> None:
        """Read the upstream stream into ``buffer`` until Triton ends the request; every failure goes to the
        consumer as ``mapping.UpstreamError``."""
        rid = self.request_id
        assembler = self.assembler
        ended = False  # Triton has ended the request (final response or error response)
        try:
            await call.write(self.infer_request)
            while not assembler.finished:
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    raise mapping.UpstreamError(grpc.StatusCode.UNAVAILABLE,
                                                f"Triton closed the stream early; retry (request id {rid})")
                if resp.error_message:
                    ended = True
                    error = mapping.map_triton_error(resp.error_message, self.request, rid)
                    if error.code == grpc.StatusCode.INTERNAL:
                        log.error("request %s: ensemble error: %s", rid, resp.error_message)
                    raise error
                out = assembler.on_response(resp.infer_response)
                ended = assembler.finished
                if out is not None and not buffer.push(out):
                    log.warning("request %s: the client reads too slowly: %d bytes wait for it (limit %d); "
                                "ending its stream", rid, buffer.bytes, buffer.cap_bytes)
                    raise mapping.UpstreamError(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"the client reads too slowly: more than stream_buffer_bytes ({buffer.cap_bytes}) of "
                        f"output waited for it (request id {rid})")
            buffer.close()
        except mapping.UpstreamError as e:
            if e.code not in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
                log.error("request %s: %s", rid, e.message)
            buffer.fail(e)
        except grpc.aio.AioRpcError as e:
            error = mapping.map_rpc_error(e.code(), e.details() or "", rid, self.upstream.url)
            if error.code == grpc.StatusCode.INTERNAL:
                log.error("request %s: upstream gRPC error %s: %s", rid, e.code().name, e.details())
            buffer.fail(error)
        except asyncio.CancelledError:
            buffer.fail(mapping.UpstreamError(grpc.StatusCode.CANCELLED, "the request was cancelled"))
            raise
        finally:
            if ended:
                self.closer.release(call)
            else:
                if not call.done():
                    # Deadline, client cancellation, a full buffer or a broken stream: cancelling the
                    # upstream stream makes Triton cancel the request; the stop frees its KV blocks now.
                    call.cancel()
                self.closer.stop(self.upstream, rid)
