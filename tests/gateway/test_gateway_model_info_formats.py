"""GetModelInfo says which weight quantization and KV cache dtype serve requests (from the llm model's
parameters; EngineConfig's defaults when the parameters are absent)."""
from __future__ import annotations

from gateway.config import REPO
from gateway.upstream import model_facts
from tests.gateway.fake_triton import FakeTriton
from tests.gateway.test_gateway_service import harness, run
from triton_llm.v1 import llm_service_pb2 as pb


def test_model_info_names_the_quantization_and_kv_dtype():
    async def body():
        fake = FakeTriton(llm_parameters={"model_path": "models/demo-target", "quantization": "int8",
                                          "kv_cache_dtype": "int8"})
        async with harness(fake, model_root=REPO) as (_, stub, _, _):
            info = await stub.GetModelInfo(pb.GetModelInfoRequest())
            assert (info.quantization, info.kv_cache_dtype) == ("int8", "int8")
        fake = FakeTriton(llm_parameters={"model_path": "models/demo-target"})
        async with harness(fake, model_root=REPO) as (_, stub, _, _):
            info = await stub.GetModelInfo(pb.GetModelInfoRequest())
            assert (info.quantization, info.kv_cache_dtype) == ("none", "auto")
    run(body())


def test_facts_without_the_llm_config_leave_the_formats_unknown():
    facts = model_facts(None, None, [REPO])
    assert (facts.quantization, facts.kv_cache_dtype) == ("", "")
