"""Triton adapter for the engine (decoupled, one instance): logic and metrics in backend/serving/."""
import json

import triton_python_backend_utils as pb_utils

from backend.serving.llm_serving import LLMServing
from contracts.triton_stub import prepare_stub_process


class TritonPythonModel:
    def initialize(self, args):
        prepare_stub_process()
        self.serving = LLMServing.from_model_config(json.loads(args["model_config"]), pb_utils,
                                                    model_version=args["model_version"])

    def execute(self, requests):
        self.serving.execute(requests)
        return None

    def finalize(self):
        self.serving.shutdown()
        self.serving = None   # its metric families must go while the stub's shared memory still exists
