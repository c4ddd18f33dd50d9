"""Triton adapter for preprocess (validation, chat template, tokenization): logic in preprocess/serving.py."""
import json

import triton_python_backend_utils as pb_utils

from contracts.triton_stub import prepare_stub_process
from preprocess.serving import PreprocessServing


class TritonPythonModel:
    def initialize(self, args):
        prepare_stub_process()
        self.serving = PreprocessServing.from_model_config(json.loads(args["model_config"]), pb_utils)

    def execute(self, requests):
        return self.serving.execute(requests)
