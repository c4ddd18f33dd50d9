"""uvicorn serving the HTTP API in the gateway's own event loop (beside grpcio's asyncio server).

``uvicorn.Server.serve`` would install its own SIGINT/SIGTERM handlers; the gateway owns the signals
(graceful shutdown of both ports), so this runs uvicorn's steps itself: load, bind, the main loop as
a task, and on ``stop`` the graceful shutdown (open streams get ``grace`` seconds, then are closed).
"""
from __future__ import annotations

import asyncio
import logging

import uvicorn

log = logging.getLogger("gateway")

MIN_GRACE_S = 0.1


class HTTPServer:
    def __init__(self, app, listen: str, *, log_level: str = "warning", grace_s: float = 30.0,
                 tls_cert: str | None = None, tls_key: str | None = None) -> None:
        host, _, port = listen.rpartition(":")
        self.config = uvicorn.Config(app, host=host.strip("[]") or "0.0.0.0", port=int(port), log_level=log_level.lower(),
                                     access_log=False, lifespan="on", timeout_graceful_shutdown=grace_s,
                                     http="httptools", ws="none", ssl_certfile=tls_cert, ssl_keyfile=tls_key)
        self.server = uvicorn.Server(self.config)
        self._task: asyncio.Task | None = None

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]

    async def start(self) -> None:
        """Bind and serve; ``RuntimeError`` if the port cannot be bound."""
        server = self.server
        self.config.load()
        server.lifespan = self.config.lifespan_class(self.config)
        try:
            await server.startup()
        except SystemExit:       # uvicorn exits when it cannot bind
            raise RuntimeError(f"the HTTP API cannot listen on {self.config.host}:{self.config.port}") from None
        if server.should_exit:
            raise RuntimeError(f"the HTTP API did not start on {self.config.host}:{self.config.port}")
        self._task = asyncio.get_running_loop().create_task(server.main_loop())

    async def stop(self, grace: float | None = None) -> None:
        if self._task is None:
            return
        if grace is not None:   # uvicorn reports a zero timeout as exceeded, even with nothing left to wait for
            self.config.timeout_graceful_shutdown = max(grace, MIN_GRACE_S)
        self.server.should_exit = True
        await self._task
        self._task = None
        await self.server.shutdown()
