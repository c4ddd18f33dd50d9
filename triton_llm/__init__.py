"""Generated Python stubs of the typed gRPC API (proto/triton_llm/). Regenerate with ``make proto``."""
