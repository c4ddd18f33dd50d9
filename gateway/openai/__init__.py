"""The OpenAI-compatible HTTP API (chat, completions, models, SSE) in the gateway process: docs/api-openai.md."""
from gateway.openai.app import create_app
from gateway.openai.server import HTTPServer

__all__ = ["create_app", "HTTPServer"]
