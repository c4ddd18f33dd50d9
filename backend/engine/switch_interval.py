"""The interpreter's thread switch interval while the engine loop runs (``python_switch_interval_ms``).

Process-wide: how long another thread may hold the GIL once the loop thread asks for it. ``SwitchInterval``
sets it when the loop starts and puts back what it replaced when the loop stops, unless someone changed
it meanwhile.
"""
from __future__ import annotations

import sys


class SwitchInterval:
    def __init__(self, ms: float):
        self.ms = ms                                       # 0: leave the interpreter's interval alone
        self._set: tuple[float, float] | None = None       # (the interval as set, the one it replaced)

    def apply(self) -> None:
        if self.ms > 0 and self._set is None:
            before = sys.getswitchinterval()
            sys.setswitchinterval(self.ms / 1e3)
            self._set = (sys.getswitchinterval(), before)   # as Python stores it (whole microseconds)

    def restore(self) -> None:
        if self._set is not None:
            if sys.getswitchinterval() == self._set[0]:
                sys.setswitchinterval(self._set[1])
            self._set = None
