"""``python -m gateway``: serve triton_llm.v1.LLMService until SIGTERM / SIGINT (flags: --help)."""
from __future__ import annotations

import asyncio
import logging
import sys

from .config import ConfigError, from_args


def main(argv: list[str] | None = None) -> int:
    try:
        config = from_args(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .server import serve

    try:
        asyncio.run(serve(config))
    except RuntimeError as e:  # e.g. the port cannot be bound
        logging.getLogger("gateway").error("%s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
