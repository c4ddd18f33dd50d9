"""The ``llm`` Triton model's logic (``llm_serving``) and its metrics, testable without a server."""
