"""A short bounded spin for checks that a worker is about to make true (a host worker
counts a task as finished just after the task has signalled its completion)."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["spin_until"]

_SPIN_SECONDS = 0.0005


def spin_until(ready: Callable[[], bool], seconds: float = _SPIN_SECONDS) -> bool:
    """True once ``ready()`` is; False if it is not within ``seconds`` (half a
    millisecond by default), yielding the GIL between tries."""
    deadline = time.perf_counter() + seconds
    while not ready():
        if time.perf_counter() >= deadline:
            return False
        time.sleep(0)
    return True
