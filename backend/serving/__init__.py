"""The ``llm`` Triton model's logic (``llm_serving``, built by ``llm_startup``) and its metrics, testable
without a server."""
