"""The gateway with its OpenAI-compatible API in front of a FakeTriton, run in a background thread's event
loop, so that the real ``openai`` SDK (sync or async) can call it from the test's own thread."""
from __future__ import annotations

import asyncio
import contextlib
import threading

from tests.gateway.fake_triton import FakeTriton, harness

MODEL = "demo-target"
FAKE_PARAMS = {"model_path": f"models/{MODEL}", "max_model_len": "1024"}


class Served:
    def __init__(self, fake: FakeTriton, **config) -> None:
        self.fake = fake
        self.config = config
        self.loop = asyncio.new_event_loop()
        self.gw = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),), daemon=True)

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        try:
            async with harness(self.fake, openai_listen="127.0.0.1:0", **self.config) as (gw, *_):
                self.gw = gw
                self._ready.set()
                await self._stop.wait()
        except BaseException as e:      # shown by start()
            self._error = e
            self._ready.set()

    def start(self) -> "Served":
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        return self

    def call(self, coro, timeout: float = 30.0):
        """Run ``coro`` in the gateway's loop (to read or change its state)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.gw.http.port}"


@contextlib.contextmanager
def served(fake: FakeTriton | None = None, **config):
    fake = fake or FakeTriton(llm_parameters=dict(FAKE_PARAMS))
    s = Served(fake, **config).start()
    try:
        yield s
    finally:
        s.stop()
