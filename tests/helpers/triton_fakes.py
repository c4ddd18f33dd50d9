"""Stand-ins for Triton's ``triton_python_backend_utils`` and requests, so the adapters' logic is
unit-testable without a server. They mirror only the calls the adapters make."""
from __future__ import annotations

import threading
import types

import numpy as np


class Tensor:
    def __init__(self, name: str, array):
        self._name = name
        self._array = np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self):
        return self._array


class TritonError:
    def __init__(self, message: str):
        self._message = message

    def message(self) -> str:
        return self._message


class InferenceResponse:
    def __init__(self, output_tensors=None, error=None):
        self._tensors = list(output_tensors or [])
        self._error = error

    def output_tensors(self):
        return self._tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self):
        return self._error

    def tensor(self, name: str):
        for t in self._tensors:
            if t.name() == name:
                return t.as_numpy()
        raise KeyError(name)


class ResponseSender:
    def __init__(self):
        self.sent: list[tuple[InferenceResponse, int]] = []
        self.closed = threading.Event()
        self._lock = threading.Lock()

    def send(self, response=None, flags: int = 0):
        with self._lock:
            if self.closed.is_set():
                raise RuntimeError("Unable to send a response: the response sender is closed")
            self.sent.append((response, flags))
            if flags & 1:
                self.closed.set()


class Trace:
    """``request.trace()``: ``get_context()`` is Triton's span context as JSON text, or None."""

    def __init__(self, context: str | None, owner: "Request"):
        self._context, self._owner = context, owner

    def get_context(self):
        self._owner.trace_reads += 1
        return self._context


class Request:
    def __init__(self, inputs: dict, request_id: str = "", cancelled: bool = False, trace_context: str | None = None,
                 parameters: str = "{}"):
        self.inputs = {k: Tensor(k, v) for k, v in inputs.items() if v is not None}
        self._parameters = parameters    # JSON, as pb_utils.InferenceRequest.parameters() returns it
        self._id = request_id
        self.cancelled = cancelled
        self.sender = ResponseSender()
        self.trace_context = trace_context
        self.trace_reads = 0          # how often a model asked for the span context

    def trace(self) -> Trace:
        return Trace(self.trace_context, self)

    def request_id(self) -> str:
        return self._id

    def parameters(self) -> str:
        return self._parameters

    def get_response_sender(self) -> ResponseSender:
        return self.sender

    def is_cancelled(self) -> bool:
        return self.cancelled


class Metric:
    """A gauge (``set``), counter (``increment``) or histogram (``observe``; ``buckets`` given)."""

    def __init__(self, labels, kind="gauge", buckets=None):
        self.labels = dict(labels)
        self.kind = kind
        self.value = None
        self.buckets = list(buckets) if buckets is not None else None
        self.observations: list[float] = []

    def set(self, value):
        assert self.kind == "gauge", f"set() on a {self.kind}"
        self.value = value

    def increment(self, value):
        assert self.kind in ("gauge", "counter"), f"increment() on a {self.kind}"
        if self.kind == "counter" and value < 0:
            raise ValueError("a counter cannot decrease")
        self.value = (self.value or 0) + value

    def observe(self, value):
        assert self.kind == "histogram", f"observe() on a {self.kind}"
        self.observations.append(value)

    @property
    def count(self) -> int:
        return len(self.observations)


class MetricFamily:
    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"
    created: list = []

    def __init__(self, name, description, kind):
        self.name, self.description, self.kind = name, description, kind
        self.metrics: list[Metric] = []

    def Metric(self, labels=None, buckets=None):  # noqa: N802 (Triton's name)
        # Triton 2.51: a histogram needs its bucket boundaries (increasing); other kinds take none
        if (self.kind == self.HISTOGRAM) != (buckets is not None):
            raise ValueError(f"buckets are required for histograms only ({self.name})")
        if buckets is not None and list(buckets) != sorted(set(buckets)):
            raise ValueError(f"buckets must increase ({self.name})")
        m = Metric(labels or {}, self.kind, buckets)
        self.metrics.append(m)
        return m


class BLSRequest:
    """``pb_utils.InferenceRequest``: records ``exec`` calls on a shared log."""

    def __init__(self, log: list, responder=None, **kwargs):
        self.kwargs = kwargs
        self._log = log
        self._responder = responder

    def exec(self, decoupled=False):
        self._log.append((self.kwargs, decoupled))
        return iter(self._responder(self.kwargs) if self._responder else [InferenceResponse()])


def make_pb_utils(bls_responder=None) -> types.SimpleNamespace:
    """A fresh fake module; ``pb.bls_calls`` lists the BLS requests made through it."""
    bls_calls: list = []

    def get_input_tensor_by_name(request, name):
        return request.inputs.get(name)

    families: list[MetricFamily] = []

    class _Family(MetricFamily):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            families.append(self)

    return types.SimpleNamespace(
        Tensor=Tensor, TritonError=TritonError, InferenceResponse=InferenceResponse,
        get_input_tensor_by_name=get_input_tensor_by_name, TRITONSERVER_RESPONSE_COMPLETE_FINAL=1,
        MetricFamily=_Family, families=families, bls_calls=bls_calls,
        InferenceRequest=lambda **kw: BLSRequest(bls_calls, bls_responder, **kw),
    )
