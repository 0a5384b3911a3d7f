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

The step hooks and the culprit naming are shared with the production loop monitor
(:class:`asynccube.LoopMonitor`): :func:`attach_steps` and :class:`TrioSteps` time the
steps of a loop for any :class:`StepSink`, :func:`describe_handle` and
:func:`describe_trio_task` name the code behind a step. They live here, in the standard
library only, so that the pytest plugin's light half imports nothing of asynccube's.
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
from typing import Any, Protocol

__all__ = [
    "LoopLagProbe",
    "StepSink",
    "TrioLagProbe",
    "TrioSteps",
    "attach_steps",
    "describe_handle",
    "describe_trio_task",
    "detach_steps",
    "max_lag_seconds",
    "suspended_at",
]


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


class StepSink(Protocol):
    """What times the steps of a loop: ``begin`` before a step, ``end`` after it with what
    ``begin`` returned and the step (an asyncio ``Handle``, or a trio ``Task``)."""

    def begin(self) -> Any:
        """A step starts: return the mark ``end`` will be given."""

    def end(self, step: Any, mark: Any) -> None:
        """The step has ended (or raised)."""


_sinks: dict[asyncio.AbstractEventLoop, tuple[StepSink, ...]] = {}


def attach_steps(loop: asyncio.AbstractEventLoop, sink: StepSink) -> None:
    """Time every callback ``loop`` runs (task steps, ``call_soon`` callbacks, timers) for
    ``sink``. The first sink of any loop wraps ``asyncio.events.Handle._run``; the last one
    gone (:func:`detach_steps`) puts it back, so nothing is timed while none is attached."""
    _sinks[loop] = (*_sinks.get(loop, ()), sink)
    events.Handle._run = _timed_run  # type: ignore[method-assign]


def detach_steps(loop: asyncio.AbstractEventLoop, sink: StepSink) -> None:
    """Stop timing ``loop``'s callbacks for ``sink`` (see :func:`attach_steps`)."""
    left = tuple(s for s in _sinks.get(loop, ()) if s is not sink)
    if left:
        _sinks[loop] = left
    else:
        _sinks.pop(loop, None)
    if not _sinks:
        events.Handle._run = _original_run  # type: ignore[method-assign,assignment]


def _timed_run(self: events.Handle) -> None:
    """``Handle._run`` timed for the loop's sinks. Like asyncio's own, it lets go of the
    handle before it returns: from Python 3.12 a coroutine that ends in this step keeps
    the frames below it (``f_back``) for as long as its own frame is kept, by an error's
    traceback say; this frame holding the handle would keep the handle's arguments (the
    future whose error that is: a cycle only the collector breaks, and with it the
    buffers the traceback's frames hold)."""
    sinks = _sinks.get(self._loop)  # type: ignore[attr-defined]
    if sinks is None:
        _original_run(self)
    elif len(sinks) == 1:  # the usual case, kept short: this runs for every step
        sink = sinks[0]
        mark = sink.begin()
        try:
            _original_run(self)
        finally:
            sink.end(self, mark)
    else:
        marks = [sink.begin() for sink in sinks]
        try:
            _original_run(self)
        finally:
            for sink, mark in zip(reversed(sinks), reversed(marks), strict=True):
                sink.end(self, mark)
    del self  # see above (asyncio's Handle._run drops its own the same way)


class TrioSteps:
    """A trio instrument timing every task step of the run for ``sink`` (add it with
    ``trio.lowlevel.add_instrument``; trio finds the hooks by name)."""

    def __init__(self, sink: StepSink) -> None:
        self.sink = sink
        self._marks: dict[Any, Any] = {}

    def before_task_step(self, task: Any) -> None:
        """trio's hook: a step of ``task`` starts."""
        self._marks[task] = self.sink.begin()

    def after_task_step(self, task: Any) -> None:
        """trio's hook: the step of ``task`` has ended."""
        try:
            mark = self._marks.pop(task)
        except KeyError:
            return
        self.sink.end(task, mark)


class _OwnTime:
    """What the probes share: the worst own time of a step and the code behind it. One
    probe times at a time: one started inside another (a test probing its own code
    under the plugin's probe) takes over, and the outer one records nothing more."""

    active: _OwnTime | None = None

    def __init__(self) -> None:
        self.worst = 0.0
        self.culprit = ""
        self.callbacks = 0
        self.fd: int | None = None
        self._patches: Any = None
        self.timing = False

    def begin(self) -> _Mark:
        """A step starts: the clocks (see :func:`_mark`)."""
        return _mark(self.fd)

    def end(self, step: Any, mark: _Mark) -> None:
        """A step has ended: keep it if it is the longest so far."""
        if not self.timing or _OwnTime.active is not self:
            return  # the step that stopped the probe, or another probe took over
        own = _own_since(mark, self.fd)
        self.callbacks += 1
        if own > self.worst:
            self.worst = own
            self.culprit = f"{self._describe(step)}{suspended_at(step)}"

    def _describe(self, step: Any) -> str:
        return describe_handle(step)


class LoopLagProbe(_OwnTime):
    """Records the callback with the longest own time on the current loop."""

    def __init__(self) -> None:
        super().__init__()
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Start timing the running loop's callbacks (call it on the loop thread)."""
        self._loop = asyncio.get_running_loop()
        self.fd, self._patches = _begin_timing()
        self.timing = True
        _OwnTime.active = self
        attach_steps(self._loop, self)

    async def stop(self) -> float:
        """Stop timing; return the longest own time of a callback, in seconds."""
        await asyncio.sleep(0)
        self.timing = False
        _OwnTime.active = None
        if self._loop is not None:
            detach_steps(self._loop, self)
        _end_timing(self.fd, self._patches)
        self.fd = None
        return self.worst


class TrioLagProbe(_OwnTime):
    """Records the trio task step with the longest own time in the current run."""

    def __init__(self) -> None:
        super().__init__()
        self._instrument = TrioSteps(self)

    def start(self) -> None:
        """Start timing the run's task steps (call it from a trio task)."""
        import trio

        self.fd, self._patches = _begin_timing()
        self.timing = True
        _OwnTime.active = self
        trio.lowlevel.add_instrument(self._instrument)  # type: ignore[arg-type]  # (by name)

    async def stop(self) -> float:
        """Stop timing; return the longest own time of a task step, in seconds."""
        import trio

        await trio.lowlevel.checkpoint()
        self.timing = False
        _OwnTime.active = None
        trio.lowlevel.remove_instrument(self._instrument)  # type: ignore[arg-type]
        _end_timing(self.fd, self._patches)
        self.fd = None
        return self.worst

    def _describe(self, step: Any) -> str:
        return describe_trio_task(step)


def describe_trio_task(task: Any) -> str:
    """Name the code behind a trio task step: the task, and its coroutine when the task's
    name does not say it already."""
    name = getattr(task, "name", task)
    coro = getattr(getattr(task, "coro", None), "__qualname__", "")
    if coro and not str(name).endswith(coro):
        return f"a step of trio task {name!r} running {coro}"
    return f"a step of trio task {name!r}"


def suspended_at(step: Any) -> str:
    """Where the task behind a step (an asyncio ``Handle`` of a task step, or a trio
    ``Task``) stopped at its step's end: the lines of its coroutines, outermost first,
    each awaiting the next (``", which ended at a.py:12 > b.py:40"``), those of the loop's
    own libraries left out (``_LOOP_LIBRARIES``), the innermost five when there are more.
    The step ran from the task's previous await to there. Empty when the step is not a
    task's, or the task ended in it. Called only for a step worth naming (the longest so
    far, a slow one): it walks the task's frames."""
    owner = getattr(getattr(step, "_callback", None), "__self__", None)
    if isinstance(owner, asyncio.Task):
        coro: Any = owner.get_coro()
    else:
        coro = getattr(step, "coro", None)
    lines: list[str] = []
    for _ in range(64):
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        module = str(frame.f_globals.get("__name__", ""))
        if not module.startswith(_LOOP_LIBRARIES):
            lines.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    if len(lines) > _WHERE_DEPTH:  # the innermost say the most
        lines = ["...", *lines[-_WHERE_DEPTH:]]
    return f", which ended at {' > '.join(lines)}" if lines else ""


_WHERE_DEPTH = 5
"""Coroutines :func:`suspended_at` names (the innermost)."""
_LOOP_LIBRARIES = ("asyncio", "anyio", "trio", "sniffio", "contextlib", "_asynccube_pytest")
"""Modules whose coroutines :func:`suspended_at` leaves out: the loop's machinery (a
test runner's, a sleep's), never the code that held the loop."""


def describe_handle(handle: Any) -> str:
    """Name the code behind an asyncio callback: a task's coroutine where there is one."""
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
