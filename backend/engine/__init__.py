"""The engine loop (``llm_engine``), its typed inbox, its assembly (``builder``) and the model runner."""
from backend.engine.llm_engine import EngineStats, LLMEngine, output_token_ids

__all__ = ["EngineStats", "LLMEngine", "output_token_ids"]
