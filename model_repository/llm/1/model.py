"""Triton adapter for the engine (decoupled, one instance): logic and metrics in backend/serving/."""
import json

import triton_python_backend_utils as pb_utils

from backend.serving.llm_startup import build_llm_serving
from contracts.triton_stub import prepare_stub_process


class TritonPythonModel:
    def initialize(self, args):
        prepare_stub_process()
        self.serving = build_llm_serving(json.loads(args["model_config"]), pb_utils,
                                         model_version=args["model_version"])

    def execute(self, requests):
        self.serving.execute(requests)
        return None

    def finalize(self):
        self.serving.shutdown()   # ends every request, then releases the metrics and their families
        self.serving = None
