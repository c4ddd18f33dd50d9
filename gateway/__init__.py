"""The typed gRPC gateway: ``triton_llm.v1.LLMService`` (proto/) in front of Triton's ``ensemble``.

    python -m gateway --listen 0.0.0.0:50051 --triton-url localhost:8001 [--auth-token-file PATH]
                      [--tls-cert PATH --tls-key PATH] [--max-inflight N] [--grace-period-s S]

``mapping`` translates fields, responses and errors (pure); ``upstream`` holds the channel to Triton,
readiness and model facts; ``service`` implements the RPCs; ``server`` wires health, reflection, TLS and
shutdown; ``config`` reads flags and environment variables (docs/api-grpc.md).
"""
from .config import ConfigError, GatewayConfig, from_args

__all__ = ["ConfigError", "GatewayConfig", "from_args"]
