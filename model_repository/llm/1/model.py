"""Triton adapter for the engine (decoupled, one instance): logic in backend/serving.py and backend/metrics.py."""
import json

import triton_python_backend_utils as pb_utils

from backend.metrics import EngineMetrics
from backend.serving import LLMServing, model_parameters, parse_float
from backend.triton_env import prepare_stub_process


class TritonPythonModel:
    def initialize(self, args):
        prepare_stub_process()
        config = json.loads(args["model_config"])
        self.serving = LLMServing.from_model_config(config, pb_utils)
        engine = self.serving.engine
        interval = parse_float("metrics_interval_s", model_parameters(config).get("metrics_interval_s", "1.0"))
        self.metrics = EngineMetrics(pb_utils, engine.stats, max_num_seqs=engine.config.max_num_seqs,
                                     model=args["model_name"], version=args["model_version"],
                                     interval_s=interval).start()

    def execute(self, requests):
        self.serving.execute(requests)
        return None

    def finalize(self):
        self.metrics.stop()
        self.serving.shutdown()
