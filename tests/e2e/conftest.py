"""End-to-end fixtures: the real tritonserver on free ports, serving model_repository/ with the
committed demo model (models/demo-target) and a small KV budget.

``E2E_MODEL_PATH`` points the server at another checkpoint (only for plumbing work while the demo
weights are being trained; the suite is meant to run against the demo model).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from cli.launcher import REPO, LauncherError, Ports, TritonServer, render_model_repository

DEMO_TARGET = REPO / "models" / "demo-target"
KV_CACHE_BYTES = "8MiB"       # a few hundred blocks: enough for 32 short streams, small enough to stay fast
MAX_NUM_SEQS = "48"
# Every e2e test runs with the shipped speculation (n-gram, at most 8 drafts, adaptive; the reference engine runs
# without it), so each greedy comparison also checks that speculation is lossless through the whole pipeline, and
# seeded sampled requests replay exactly with it (docs/sampling.md).
SPECULATIVE = {"speculative_method": "ngram", "num_speculative_tokens": "8", "speculative_adaptive": "true"}
GUIDED_COMPILE_TIMEOUT_S = "1.0"   # the shared guides compile in milliseconds; test_guided's slow one in seconds


@dataclass
class E2EServer:
    server: TritonServer
    model_path: Path

    @property
    def grpc_url(self) -> str:
        return self.server.grpc_url

    @property
    def metrics_url(self) -> str:
        return self.server.metrics_url

    def log_tail(self, lines: int = 80) -> str:
        return self.server.log_tail(lines)


def e2e_model_path() -> Path:
    path = Path(os.environ.get("E2E_MODEL_PATH") or DEMO_TARGET)
    if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
        pytest.fail(f"{path} has no checkpoint (config.json + *.safetensors): "
                    "the demo model is trained by tools/train_demo.sh")
    return path


@pytest.fixture(scope="session")
def model_path() -> Path:
    return e2e_model_path()


def start_e2e_server(root: Path, model_path: Path, env: dict[str, str] | None = None,
                     llm: dict[str, str] | None = None) -> TritonServer:
    """The model repository rendered under ``root`` (small KV budget, fast polling), served on free ports;
    ``env`` is added to the server's environment (e.g. OTEL_* for tracing), ``llm`` to the llm model's parameters.
    Fails the test if it does not start."""
    repo = render_model_repository(root / "model_repository", {
        "llm": {"model_path": str(model_path), "kv_cache_bytes": KV_CACHE_BYTES, "max_num_seqs": MAX_NUM_SEQS,
                "metrics_interval_s": "0.1", "cancel_poll_interval_s": "0.02", "device": "cpu",
                "guided_compile_timeout_s": GUIDED_COMPILE_TIMEOUT_S, **SPECULATIVE, **(llm or {})},
        "preprocess": {"tokenizer_path": str(model_path)},
        "postprocess": {"tokenizer_path": str(model_path)},
    })
    srv = TritonServer(repo, Ports.free(), log_path=root / "server.log", extra_args=["--exit-timeout-secs=30"],
                       env=env)
    srv.start()
    try:
        srv.wait_ready(timeout=300)
    except LauncherError as e:
        srv.stop()
        pytest.fail(f"the e2e tritonserver did not start: {e}", pytrace=False)
    return srv


def stop_e2e_server(srv: TritonServer) -> None:
    """Stop the server after checking that nothing was lost: the engine holds no request and no KV block.

    A non-zero exit alone is not a failure: Triton 2.51 keeps the ensemble live until its exit timeout
    after a client cancels a stream whose request was already answered, which some tests do on purpose
    (docs/serving.md, "Known Triton 2.51 issues"). An inference request still in flight at shutdown is.
    """
    from tests.e2e.helpers import gauge, kv_used, wait_until

    wait_until(lambda: kv_used(srv.metrics_url) == 0, 30, "every KV block back at the end of the e2e run")
    wait_until(lambda: gauge(srv.metrics_url, "nv_trt_llm_request_metrics", request_type="active") == 0, 30,
               "no request left in the engine at the end of the e2e run")
    code = srv.stop(timeout=45)
    if code != 0:
        shutdown = [line for line in srv.log_tail(400).splitlines() if "in-flight" in line or "live models" in line]
        stuck = [line for line in shutdown if "in-flight inference requests" in line and " 0 in-flight inference" not in line]
        if stuck:
            raise AssertionError(f"tritonserver exited with {code} with requests in flight:\n" +
                                 "\n".join(shutdown[-12:]) + f"\n--- log tail ---\n{srv.log_tail(30)}")
        print(f"\ntritonserver exited with {code} (a model stayed live until the exit timeout; no request was "
              "in flight):\n" + "\n".join(shutdown[-3:]))


@pytest.fixture(scope="session")
def lora_adapters(model_path, tmp_path_factory) -> dict[str, Path]:
    """The session server's LoRA adapters (tests/helpers/lora.py), written by PEFT for the served checkpoint."""
    from tests.helpers.lora import write_adapters

    return write_adapters(model_path, tmp_path_factory.mktemp("lora"))


@pytest.fixture(scope="session")
def server(model_path, lora_adapters, tmp_path_factory) -> E2EServer:
    adapters = ",".join(f"{name}={folder}" for name, folder in lora_adapters.items())
    srv = start_e2e_server(tmp_path_factory.mktemp("triton"), model_path, llm={"lora_adapters": adapters})
    yield E2EServer(srv, model_path)
    stop_e2e_server(srv)


@pytest.fixture(scope="session")
def openai_gateway(server, tmp_path_factory):
    """The session server's gateway with its OpenAI HTTP API, shared by the tests that only call it (a test that
    reads the gateway's own counters or restarts it starts its own); it must exit cleanly at the end."""
    from tests.e2e.helpers import start_gateway

    gw = start_gateway(server, tmp_path_factory.mktemp("gateway"), openai=True)
    yield gw
    code = gw.stop()
    assert code == 0, f"the gateway exited with {code}\n{gw.log_tail()}"


@pytest.fixture(scope="session")
def tokenizer(model_path):
    from preprocess.tokenizer import load_tokenizer

    return load_tokenizer(model_path)


@pytest.fixture(scope="session")
def reference_engine(model_path):
    """The engine in this process, to compare the pipeline's greedy text with."""
    from backend.config import EngineConfig
    from backend.engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig.from_settings(model_path=str(model_path), kv_cache_bytes=8 * 2**20,
                                                  device="cpu")).start()
    yield engine
    engine.shutdown()


@pytest.fixture(autouse=True)
def _server_log_on_failure(request, server):
    """Attach the server log tail to a failing e2e test's report."""
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(f"\n--- tritonserver log tail ---\n{server.log_tail()}")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.rep_call = rep


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/e2e/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.xdist_group("e2e"))   # one worker: the session's server
