"""A probe that measures how long the event loop was blocked.

While active, it times every callback the loop runs (``asyncio.events.Handle._run``: task
steps, ``call_soon`` callbacks, timers). A callback's own time is

* the CPU time the loop thread spent in it (``time.thread_time``), minus pauses of the
  cyclic garbage collector (the interpreter's, not the code's), plus
* the wall time it spent inside blocking waits called on the loop thread:
  ``time.sleep``, ``threading.Event.wait``, ``threading.Condition.wait``,
  ``threading.Thread.join`` and ``concurrent.futures.Future.result`` (a blocking-call
  detector; CUDA synchronizes and blocking copies spin, so they show up as CPU time).

It is also estimated from wall time, minus the time the thread was runnable but
preempted by the OS (its run-queue wait, from ``/proc/thread-self/schedstat``) and minus
collector pauses. The probe keeps the smaller of the two estimates: each overshoots in
its own way on a loaded two-core virtual machine (GIL sharing stretches wall time;
interrupt handling is charged to the running thread's CPU time), while a real block
shows in both. A callback whose own time exceeds 5 ms (``ASYNCCUBE_MAX_LAG_MS`` sets
another limit, in milliseconds) has blocked the loop. Timer
lateness is not used: there, a 1 ms timer can fire tens of milliseconds late.

Under trio, :class:`TrioLagProbe` measures the same way, with each task step (trio's
``before_task_step``/``after_task_step`` instrument hooks) as the callback.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import os
import threading
import time
from asyncio import events
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["LoopLagProbe", "TrioLagProbe", "max_lag_seconds"]


def max_lag_seconds(default: float = 0.005) -> float:
    """The limit: ``ASYNCCUBE_MAX_LAG_MS`` (e.g. under compute-sanitizer), else
    ``default`` (5 ms)."""
    raw = os.environ.get("ASYNCCUBE_MAX_LAG_MS", "").strip()
    if not raw:
        return default
    try:
        ms = float(raw)
    except ValueError:
        ms = -1.0
    if not ms > 0:
        raise ValueError(f"ASYNCCUBE_MAX_LAG_MS must be a number of milliseconds > 0, got {raw!r}")
    return ms / 1e3


_original_run: Callable[[events.Handle], None] = events.Handle._run
_BLOCKING: list[tuple[Any, str]] = [
    (time, "sleep"),
    (threading.Event, "wait"),
    (threading.Condition, "wait"),
    (threading.Thread, "join"),
    (concurrent.futures.Future, "result"),
]


def _open_schedstat() -> int | None:
    try:
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    except OSError:
        return None
    if _runqueue_seconds(fd) is None:
        os.close(fd)
        return None
    return fd


def _runqueue_seconds(fd: int | None) -> float | None:
    if fd is None:
        return None
    try:
        return int(os.pread(fd, 96, 0).split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class _Clock:
    """Collector time and blocking-wait time seen on the loop thread so far."""

    gc_seconds = 0.0
    gc_wall = 0.0
    gc_start = 0.0
    gc_wall_start = 0.0
    blocked_seconds = 0.0
    loop_thread = -1
    depth = 0


def _gc_timer(phase: str, info: dict[str, Any]) -> None:
    if threading.get_ident() != _Clock.loop_thread:
        return
    if phase == "start":
        _Clock.gc_start = time.thread_time()
        _Clock.gc_wall_start = time.perf_counter()
    else:
        _Clock.gc_seconds += time.thread_time() - _Clock.gc_start
        _Clock.gc_wall += time.perf_counter() - _Clock.gc_wall_start


def _wrap_blocking(fn: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != _Clock.loop_thread or _Clock.depth:
            return fn(*args, **kwargs)  # another thread, or nested in a timed wait
        start = time.perf_counter()
        _Clock.depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _Clock.depth -= 1
            _Clock.blocked_seconds += time.perf_counter() - start

    timed.__wrapped__ = fn  # type: ignore[attr-defined]
    return timed


def _begin_timing() -> tuple[int | None, Any]:
    """What every probe does as it starts: mark the loop's thread, open its scheduler
    statistics, time the collector's pauses and wrap the known blocking calls. Returns
    the statistics descriptor and the wrapping to undo. The collector's state is left
    as found (no collection, no freeze): its pauses are measured and left out instead."""
    _Clock.loop_thread = threading.get_ident()
    fd = _open_schedstat()
    gc.callbacks.append(_gc_timer)
    patches = _patched_blocking_calls()
    patches.__enter__()
    return fd, patches


def _end_timing(fd: int | None, patches: Any) -> None:
    """Undo :func:`_begin_timing`."""
    patches.__exit__(None, None, None)
    gc.callbacks.remove(_gc_timer)
    _Clock.loop_thread = -1
    if fd is not None:
        os.close(fd)


@contextmanager
def _patched_blocking_calls() -> Iterator[None]:
    originals = [(owner, name, getattr(owner, name)) for owner, name in _BLOCKING]
    for owner, name, fn in originals:
        setattr(owner, name, _wrap_blocking(fn))
    try:
        yield
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)


class LoopLagProbe:
    """Records the callback with the longest own time on the current loop."""

    _active: LoopLagProbe | None = None

    def __init__(self) -> None:
        self.worst = 0.0
        self.culprit = ""
        self.callbacks = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._patches: Any = None
        self.fd: int | None = None

    def start(self) -> None:
        """Start timing the running loop's callbacks (call it on the loop thread)."""
        self._loop = asyncio.get_running_loop()
        self.fd, self._patches = _begin_timing()
        LoopLagProbe._active = self
        events.Handle._run = _timed_run  # type: ignore[method-assign]

    async def stop(self) -> float:
        """Stop timing; return the longest own time of a callback, in seconds."""
        await asyncio.sleep(0)
        events.Handle._run = _original_run  # type: ignore[method-assign,assignment]
        LoopLagProbe._active = None
        _end_timing(self.fd, self._patches)
        self.fd = None
        return self.worst

    def _record(self, handle: events.Handle, seconds: float) -> None:
        self.callbacks += 1
        if seconds > self.worst and getattr(handle, "_loop", None) is self._loop:
            self.worst = seconds
            self.culprit = _describe(handle)


_Mark = tuple[float, float, float, "float | None", float, float]


def _mark(fd: int | None) -> _Mark:
    """The clocks at the start of a callback."""
    queued = _runqueue_seconds(fd)
    return (
        _Clock.gc_seconds,
        _Clock.gc_wall,
        _Clock.blocked_seconds,
        queued,
        time.thread_time(),
        time.perf_counter(),
    )


def _own_since(mark: _Mark, fd: int | None) -> float:
    """A callback's own time since ``mark`` (see the module docstring)."""
    collected, gc_wall, blocked, queued, cpu, wall = mark
    wall = time.perf_counter() - wall - (_Clock.gc_wall - gc_wall)
    own = time.thread_time() - cpu - (_Clock.gc_seconds - collected)
    own += _Clock.blocked_seconds - blocked
    if queued is not None:
        wall -= (_runqueue_seconds(fd) or queued) - queued
        own = min(own, wall)
    return own


def _timed_run(self: events.Handle) -> None:
    probe = LoopLagProbe._active
    fd = probe.fd if probe is not None else None
    mark = _mark(fd)
    try:
        _original_run(self)
    finally:
        own = _own_since(mark, fd)
        if probe is not None and LoopLagProbe._active is probe:
            probe._record(self, own)


class TrioLagProbe:
    """Records the trio task step with the longest own time in the current run."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.culprit = ""
        self.callbacks = 0
        self.fd: int | None = None
        self._marks: dict[Any, _Mark] = {}
        self._patches: Any = None

    def start(self) -> None:
        """Start timing the run's task steps (call it from a trio task)."""
        import trio

        self.fd, self._patches = _begin_timing()
        trio.lowlevel.add_instrument(self)  # type: ignore[arg-type]  # (hooks by name)

    async def stop(self) -> float:
        """Stop timing; return the longest own time of a task step, in seconds."""
        import trio

        await trio.lowlevel.checkpoint()
        trio.lowlevel.remove_instrument(self)  # type: ignore[arg-type]
        _end_timing(self.fd, self._patches)
        self.fd = None
        return self.worst

    def before_task_step(self, task: Any) -> None:
        """trio's hook: a step of ``task`` starts."""
        self._marks[task] = _mark(self.fd)

    def after_task_step(self, task: Any) -> None:
        """trio's hook: the step of ``task`` has ended."""
        mark = self._marks.pop(task, None)
        if mark is None:
            return
        own = _own_since(mark, self.fd)
        self.callbacks += 1
        if own > self.worst:
            self.worst = own
            self.culprit = f"a step of trio task {task.name!r}"


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
