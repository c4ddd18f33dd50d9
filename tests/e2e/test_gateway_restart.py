"""Triton stopped under the gateway: calls get UNAVAILABLE at once and health says NOT_SERVING; Triton
started again on the same ports: served again, without restarting the gateway.

Uses its own tritonserver (not the session's, which other tests share), on fixed free ports so the
restarted server is where the gateway's channel reconnects.
"""
from __future__ import annotations

import os
import time

import grpc
import pytest

from cli.gateway_process import GatewayProcess
from cli.launcher import LauncherError, Ports, TritonServer, free_port, render_model_repository
from triton_llm.v1 import llm_service_pb2 as pb
from triton_llm.v1 import llm_service_pb2_grpc as pb_grpc

KV_CACHE_BYTES = "8MiB"
REQ = pb.GenerateRequest(prompt="def f():", max_tokens=8, temperature=0.0, stream=True)


def wait_for(predicate, timeout: float, what: str) -> float:
    t = time.monotonic()
    while not predicate():
        if time.monotonic() - t > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - t


def test_triton_down_is_unavailable_and_back_is_served(model_path, tmp_path):
    repo = render_model_repository(tmp_path / "model_repository", {
        "llm": {"model_path": str(model_path), "kv_cache_bytes": KV_CACHE_BYTES, "device": "cpu",
                "max_num_seqs": "8"},
        "preprocess": {"tokenizer_path": str(model_path)},
        "postprocess": {"tokenizer_path": str(model_path)},
    })
    triton = TritonServer(repo, Ports.free(), log_path=tmp_path / "triton.log", extra_args=["--exit-timeout-secs=10"])
    gw = GatewayProcess(f"127.0.0.1:{free_port()}", triton.grpc_url, env={k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")},
                        extra_args=["--health-interval-s", "0.2"], log_path=tmp_path / "gateway.log")
    try:
        try:
            triton.start()
            triton.wait_ready(timeout=300)
        except LauncherError as e:
            pytest.fail(f"the test's tritonserver did not start: {e}", pytrace=False)
        gw.start()
        gw.wait_ready(timeout=60)
        with grpc.insecure_channel(gw.target) as ch:
            stub = pb_grpc.LLMServiceStub(ch)
            before = "".join(m.text for m in stub.Generate(REQ, timeout=60))
            assert before

            triton.stop(timeout=30)
            t = time.monotonic()
            with pytest.raises(grpc.RpcError) as e:
                list(stub.Generate(REQ, timeout=30))
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value.details()
            assert time.monotonic() - t < 2.0, "UNAVAILABLE should come at once, not after a hang"
            wait_for(lambda: gw.health() == "NOT_SERVING", 3.0, "health NOT_SERVING with Triton down")
            with pytest.raises(grpc.RpcError) as e:  # still prompt while it stays down
                stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE

            triton.start()
            triton.wait_ready(timeout=300)
            took = wait_for(lambda: gw.health() == "SERVING", 15.0, "health SERVING with Triton back")
            after = "".join(m.text for m in stub.Generate(REQ, timeout=60))
            assert after == before, "greedy text differs after the restart"
            assert took < 15.0
        assert gw.proc is not None and gw.proc.poll() is None, "the gateway was not restarted"
    finally:
        code = gw.stop()
        triton.stop(timeout=30)
    assert code == 0, gw.log_tail()
