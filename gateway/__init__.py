"""The gateway: ``triton_llm.v1.LLMService`` (proto/) and the OpenAI-compatible HTTP API (``openai/``) in
front of Triton's ``ensemble``, in one process.

    python -m gateway --listen 0.0.0.0:50051 --triton-url localhost:8001 [--openai-listen 0.0.0.0:9000]
                      [--auth-token-file PATH] [--tls-cert PATH --tls-key PATH] [--max-inflight N]

``mapping`` translates fields, responses and errors (pure); ``upstream`` holds the channel to Triton,
readiness and model facts; ``generation`` is one request's stream to Triton, for both APIs; ``service``
implements the RPCs; ``server`` wires health, reflection, TLS, the HTTP API and shutdown; ``config`` reads
flags and environment variables (docs/api-grpc.md, docs/api-openai.md).
"""
from .config import ConfigError, GatewayConfig, from_args

__all__ = ["ConfigError", "GatewayConfig", "from_args"]
