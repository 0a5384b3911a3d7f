"""A probe that measures how long the event loop was blocked.

It times every callback the loop runs (``asyncio.events.Handle._run``: task steps,
``call_soon`` callbacks, timers) while it is active. A callback that keeps the loop
thread for more than 5 ms has blocked the loop.

Pauses of the cyclic garbage collector are not counted either: they are the
interpreter's, and land in whichever callback happens to allocate (the probe freezes the
heap when it starts, so they stay short). Time the thread spent runnable but preempted by
the OS (its run-queue wait, from
``/proc/thread-self/schedstat``) is not counted: on a loaded two-core virtual machine
the scheduler can preempt any thread for several milliseconds, which says nothing about
the code. Sleeping, waiting on a lock or the GIL, or computing all count. Timer lateness
is not used at all: on such machines a 1 ms sleep can wake up tens of ms late.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from asyncio import events
from collections.abc import Callable
from typing import Any

MAX_LAG_SECONDS = 0.005

_original_run: Callable[[events.Handle], None] = events.Handle._run


def _open_schedstat() -> int | None:
    try:
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    except OSError:
        return None
    if _runqueue_ns(fd) is None:
        os.close(fd)
        return None
    return fd


def _runqueue_ns(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 96, 0).split()[1])
    except (OSError, IndexError, ValueError):
        return None


class LoopLagProbe:
    """Records the longest blocking callback on the current loop while active."""

    _active: LoopLagProbe | None = None

    def __init__(self) -> None:
        self.worst = 0.0
        self.culprit = ""
        self.callbacks = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd: int | None = None

    def start(self) -> None:
        """Start timing the running loop's callbacks (call it on the loop thread)."""
        self._loop = asyncio.get_running_loop()
        self._fd = _open_schedstat()
        gc.collect()
        gc.freeze()
        LoopLagProbe._active = self
        gc.callbacks.append(_gc_timer)
        events.Handle._run = _timed_run  # type: ignore[method-assign]

    async def stop(self) -> float:
        """Stop timing; return the longest blocking callback, in seconds."""
        await asyncio.sleep(0)
        events.Handle._run = _original_run  # type: ignore[method-assign]
        gc.callbacks.remove(_gc_timer)
        LoopLagProbe._active = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        return self.worst

    def _record(self, handle: events.Handle, seconds: float) -> None:
        self.callbacks += 1
        if seconds > self.worst and handle._loop is self._loop:
            self.worst = seconds
            self.culprit = _describe(handle)


_gc_seconds = [0.0, 0.0]  # total collector time so far, start of the current collection


def _gc_timer(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_seconds[1] = time.perf_counter()
    else:
        _gc_seconds[0] += time.perf_counter() - _gc_seconds[1]


def _timed_run(self: events.Handle) -> None:
    probe = LoopLagProbe._active
    fd = probe._fd if probe is not None else None
    queued = _runqueue_ns(fd) if fd is not None else None
    collected = _gc_seconds[0]
    start = time.perf_counter()
    try:
        _original_run(self)
    finally:
        elapsed = time.perf_counter() - start - (_gc_seconds[0] - collected)
        if probe is not None and LoopLagProbe._active is probe:
            if queued is not None and fd is not None:
                elapsed -= ((_runqueue_ns(fd) or queued) - queued) / 1e9
            probe._record(self, elapsed)


def _describe(handle: Any) -> str:
    """Name the code behind a callback: a task's coroutine where there is one."""
    callback = getattr(handle, "_callback", None)
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        coro = owner.get_coro()
        name = getattr(coro, "__qualname__", repr(coro))
        return f"a step of task {owner.get_name()!r} running {name}"
    try:
        return repr(handle)[:300]
    except Exception:
        return type(handle).__name__
