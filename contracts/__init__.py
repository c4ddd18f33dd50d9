"""The contracts the pipeline's three models share, importable without torch.

- ``sampling_params``: ``SamplingParams`` and ``GuideSpec`` (what a request asks the engine for);
- ``output_options``: ``OutputOptions`` (what postprocess needs, forwarded by the engine);
- ``wire``: the tensors between preprocess, llm and postprocess, and their JSON payloads;
- ``field_names``: which ensemble input sets which engine field (for error messages);
- ``validation``: the field checks behind every ``ValueError`` naming a field;
- ``triton_config``: reading a Triton model's ``parameters`` and resolving relative paths;
- ``triton_stub``: process setup inside Triton's Python backend stub.

Nothing here imports torch, numpy-heavy code or another package of this repository.
"""
