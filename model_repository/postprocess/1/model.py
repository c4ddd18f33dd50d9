"""Triton adapter for postprocess (detokenize, stop strings, finish reasons): logic in postprocess/serving.py."""
import json

import triton_python_backend_utils as pb_utils

from contracts.triton_stub import prepare_stub_process
from postprocess.serving import PostprocessServing


class TritonPythonModel:
    def initialize(self, args):
        prepare_stub_process()
        self.serving = PostprocessServing.from_model_config(json.loads(args["model_config"]), pb_utils)

    def execute(self, requests):
        return self.serving.execute(requests)

    def finalize(self):
        self.serving.close()      # its metric, then the family, while the stub's shared memory still exists
        self.serving = None
