"""The gateway's side of Triton: one gRPC channel, readiness polling, and the served model's facts.

Generate calls use ``ModelStreamInfer`` on this channel directly (``tritonclient.grpc``'s generated
stub), one stream per call. The channel reconnects on its own with a short backoff (at most
``MAX_RECONNECT_BACKOFF_MS``), so a restarted tritonserver is served again without restarting the
gateway; calls made while it is down fail at once with UNAVAILABLE (no wait-for-ready).
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

log = logging.getLogger("gateway")

MAX_RECONNECT_BACKOFF_MS = 1000
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 2**20),
    ("grpc.max_receive_message_length", 64 * 2**20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
ENGINE_MODEL = "llm"            # the decoupled engine model: model_path, max_model_len, speculative settings
PREPROCESS_MODEL = "preprocess"  # tokenizer_path, max_model_len


def _params(config: dict) -> dict[str, str]:
    return {k: v.get("string_value", "") for k, v in (config.get("parameters") or {}).items()}


def resolve_path(raw: str, roots: list[Path]) -> Path | None:
    """``raw`` if absolute, else the first ``root / raw`` that exists (Triton's paths are relative to
    the repository root it was started in)."""
    if not raw:
        return None
    p = Path(raw)
    if p.is_absolute():
        return p
    for root in roots:
        if (root / p).exists():
            return (root / p).resolve()
    return None


def lora_adapter_names(adapters: str, lora_dir: str, roots: list[Path]) -> list[str]:
    """The adapter names the engine serves: ``name=folder`` pairs of ``lora_adapters`` and the sub-folders of
    ``lora_dir`` holding an ``adapter_config.json`` (as backend/lora/registry.py reads them)."""
    names = {item.partition("=")[0].strip() for item in adapters.split(",") if "=" in item}
    root = resolve_path(lora_dir.strip(), roots) if lora_dir.strip() not in ("", "none", "null") else None
    if root is not None and root.is_dir():
        names |= {p.name for p in root.iterdir() if (p / "adapter_config.json").is_file()}
    return sorted(n for n in names if n)


@dataclass
class ModelFacts:
    """What the gateway knows of the served model (from Triton's model configs and config.json)."""

    name: str = ""
    model_path: Path | None = None
    tokenizer_path: Path | None = None
    max_context_tokens: int = 0
    vocab_size: int = 0
    architecture: str = ""
    speculative_method: str | None = None    # "" = none, None = unknown
    num_speculative_tokens: int = 0
    quantization: str = ""                   # weights: none | int8 | int4 | fp8 ("" = unknown)
    kv_cache_dtype: str = ""                 # KV storage: auto | int8 | fp8 ("" = unknown)
    lora_adapters: list[str] = field(default_factory=list)   # LoRA adapter names served (sorted)
    errors: list[str] = field(default_factory=list)


def model_facts(engine_cfg: dict | None, pre_cfg: dict | None, roots: list[Path],
                tokenizer_override: Path | None = None) -> ModelFacts:
    """Facts from the ``llm`` and ``preprocess`` model configs (Triton's JSON form), reading the
    checkpoint's config.json where the ``llm`` config's ``model_path`` points."""
    facts = ModelFacts()
    ep = _params(engine_cfg or {})
    pp = _params(pre_cfg or {})
    raw_model = ep.get("model_path", "")
    facts.model_path = resolve_path(raw_model, roots)
    facts.name = Path(raw_model).name if raw_model else ""
    if engine_cfg is not None:
        facts.quantization = ep.get("quantization", "").strip() or "none"        # EngineConfig's defaults
        facts.kv_cache_dtype = ep.get("kv_cache_dtype", "").strip() or "auto"
        facts.speculative_method = ep.get("speculative_method", "") or ""
        if facts.speculative_method in ("none", "None"):
            facts.speculative_method = ""
        try:
            facts.num_speculative_tokens = int(ep.get("num_speculative_tokens") or 0) if facts.speculative_method else 0
        except ValueError:
            facts.num_speculative_tokens = 0
        facts.lora_adapters = lora_adapter_names(ep.get("lora_adapters", ""), ep.get("lora_dir", ""), roots)
    hf: dict = {}
    if facts.model_path is not None:
        try:
            hf = json.loads((facts.model_path / "config.json").read_text())
        except (OSError, ValueError) as e:
            facts.errors.append(f"{facts.model_path / 'config.json'}: {e}")
    elif raw_model:
        facts.errors.append(f"model_path {raw_model!r} not found under {[str(r) for r in roots]}")
    facts.vocab_size = int(hf.get("vocab_size") or 0)
    archs = hf.get("architectures") or []
    facts.architecture = str(archs[0]) if archs else ""
    ctx = 0
    for raw in (ep.get("max_model_len", ""), pp.get("max_model_len", "")):
        if raw.strip():
            try:
                ctx = int(raw)
                break
            except ValueError:
                pass
    facts.max_context_tokens = ctx or int(hf.get("max_position_embeddings") or 0)
    facts.tokenizer_path = tokenizer_override or resolve_path(pp.get("tokenizer_path", ""), roots) or facts.model_path
    return facts


class TritonUpstream:
    """The channel to Triton, the ensemble's readiness, and the served model's facts (cached)."""

    def __init__(self, url: str, model: str = "ensemble", *, poll_interval_s: float = 1.0,
                 roots: list[Path] | None = None, tokenizer_path: Path | None = None) -> None:
        self.url = url
        self.model = model
        self.poll_interval_s = poll_interval_s
        self.roots = roots or []
        self.tokenizer_path = tokenizer_path
        self.channel = grpc.aio.insecure_channel(url, options=CHANNEL_OPTIONS)
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.ready = False
        self._on_change: list[Callable[[bool], Awaitable[None] | None]] = []
        self._poller: asyncio.Task | None = None
        self._facts: ModelFacts | None = None
        self._guide_types: list[str] | None = None

    def on_readiness_change(self, callback: Callable[[bool], Awaitable[None] | None]) -> None:
        self._on_change.append(callback)

    async def check_ready(self) -> bool:
        try:
            resp = await self.stub.ModelReady(service_pb2.ModelReadyRequest(name=self.model), timeout=2.0)
            return bool(resp.ready)
        except grpc.aio.AioRpcError:
            return False

    async def poll_once(self) -> bool:
        ready = await self.check_ready()
        if ready != self.ready:
            log.info("Triton %s model %r is %s", self.url, self.model, "ready" if ready else "NOT ready")
            self.ready = ready
            self._facts = None          # a restarted server may serve another configuration
            self._guide_types = None
            for cb in self._on_change:
                result = cb(ready)
                if asyncio.iscoroutine(result):
                    await result
        return ready

    async def _poll(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception:  # never let the poller die
                log.exception("readiness poll failed")
            await asyncio.sleep(self.poll_interval_s)

    def start(self) -> None:
        if self._poller is None:
            self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            try:
                await self._poller
            except (asyncio.CancelledError, Exception):
                pass
            self._poller = None
        await self.channel.close()

    async def _config(self, name: str) -> dict | None:
        from google.protobuf import json_format

        try:
            resp = await self.stub.ModelConfig(service_pb2.ModelConfigRequest(name=name), timeout=5.0)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                raise
            return None
        return json_format.MessageToDict(resp.config, preserving_proto_field_name=True)

    @property
    def served_name(self) -> str:
        """The served checkpoint's name once its facts were read (GetModelInfo, Tokenize), else Triton's model."""
        return self._facts.name if self._facts is not None and self._facts.name else self.model

    async def facts(self) -> ModelFacts:
        """The served model's facts, read once per readiness period."""
        if self._facts is None:
            engine_cfg, pre_cfg = await asyncio.gather(self._config(ENGINE_MODEL), self._config(PREPROCESS_MODEL))
            self._facts = model_facts(engine_cfg, pre_cfg, self.roots, self.tokenizer_path)
            for err in self._facts.errors:
                log.warning("model facts: %s", err)
        return self._facts

    async def supported_guide_types(self, probe: Callable[[], "asyncio.Future[str | None]"]) -> list[str]:
        """The guide types the engine accepts, found once per readiness period by ``probe()``: one
        ``json``-guided request of one token; it returns the error text, or None when accepted."""
        if self._guide_types is None:
            error = await probe()
            from preprocess import GUIDE_TYPES

            self._guide_types = list(GUIDE_TYPES) if error is None else []
        return self._guide_types
