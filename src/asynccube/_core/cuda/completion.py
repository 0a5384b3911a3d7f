"""Completion of CUDA work without blocking the event loop and without Python in a
driver callback thread.

A :class:`CudaCompletion` is one or more CUDA events recorded after the work, plus a
finalizer that produces the result (e.g. bytes out of a pinned staging buffer):

* ``done()`` is ``cuEventQuery``: not ready, ready, or a typed error (the driver's
  sticky errors surface here, so a faulted context never leaves an awaiter hanging);
* ``wait(timeout)`` blocks a helper thread: ``cuEventSynchronize`` on an event created
  with ``CU_EVENT_BLOCKING_SYNC`` (the thread sleeps instead of spinning), or a bounded
  sleep when a timeout is given;
* ``result()`` runs the finalizer once, then gives the events back to their pool.

For long waits the completion can also hand the event loop a file descriptor
(``fileno()``) that becomes readable when the work is done, so no thread is needed at
all: a *notify stream* paired with the work's stream waits on the event
(``cuStreamWaitEvent``) and then runs a C ``close()`` as a host function
(``cuLaunchHostFunc``, called through its C entry point so that no Python wrapper, and
so no GIL, is involved: the compiled hot path's own C function, or libc's in the twin)
on the write end of a fresh pipe. The driver's callback thread closes the pipe; the
loop's selector sees the read end become readable (EOF) and wakes.
The notify stream keeps the host function off the work stream, which therefore never
stalls behind the callback. The write end belongs to the driver from then on and is
never touched again by Python. The driver skips host functions once the context has a
sticky error, so a watcher of the descriptor must also poll ``done()`` now and then.

Short waits (``add_done_callback``, the first ``SPIN_SECONDS``) are polled by one
:class:`_Sweep` per loop: one callback per loop iteration for every pending completion,
oldest first, rather than one each (64 tasks awaiting the device made every iteration
cost 64 Python calls and event queries).

Event queries and records, and the host function, go through :mod:`.hotpath` (the
compiled module, or its pure-Python twin).
"""

from __future__ import annotations

import asyncio
import os
import select
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final, Generic, TypeVar

from ..channel.backend import running_loop
from .driver import check, cu, error_from, set_current
from .native.hotpath import hot

__all__ = ["CudaCompletion", "EventPool", "HostFuncNotifier"]

T = TypeVar("T")

_NOT_READY = 600  # CUDA_ERROR_NOT_READY


class EventPool:
    """Reusable CUDA events for completions (``BLOCKING_SYNC | DISABLE_TIMING``).

    ``take``/``give`` may be called from any thread (list ``pop``/``append`` are atomic).
    """

    __slots__ = ("_flags", "_free", "created")

    def __init__(self, flags: int | None = None) -> None:
        hot.open_driver()
        d = cu()
        if flags is None:
            flags = int(d.CUevent_flags.CU_EVENT_BLOCKING_SYNC) | int(
                d.CUevent_flags.CU_EVENT_DISABLE_TIMING
            )
        self._flags = flags
        self._free: list[Any] = []
        self.created = 0

    def take(self) -> Any:
        """An event, reused when one is free."""
        try:
            return self._free.pop()
        except IndexError:
            pass
        self.created += 1
        return check(cu().cuEventCreate(self._flags), "cuEventCreate")

    def give(self, event: Any) -> None:
        """Return ``event`` (nothing may still wait on it)."""
        self._free.append(event)

    def record(self, stream: Any) -> Any:
        """Take an event and record it on ``stream``."""
        event = self.take()
        err = hot.event_record(event, stream)
        if err:
            self._free.append(event)
            raise error_from(err, "cuEventRecord")
        return event

    def close(self) -> None:
        """Destroy the free events."""
        d = cu()
        while self._free:
            d.cuEventDestroy(self._free.pop())


class HostFuncNotifier:
    """Arms pipes that the driver closes, from its own thread, when events complete.

    Owner thread only. ``arm(event, stream)`` returns the read end of a new pipe; it
    becomes readable once ``event`` has completed. One notify stream is created per
    work stream seen (bounded by the server's stream pool).
    """

    spin_ns = 2_000_000
    """How long the compiled module's C thread polls an armed pipe's work before a host
    function takes over (the driver's callback thread wakes 0.1-0.7 ms late: too late
    for a copy of a few MiB). Costs a core while it polls; never the loop or the GIL."""

    def __init__(self) -> None:
        hot.open_driver()
        self._notify: dict[int, Any] = {}
        self.armed = 0

    def _stream_for(self, stream: Any) -> Any:
        key = int(stream)
        side = self._notify.get(key)
        if side is None:
            d = cu()
            flags = int(d.CUstream_flags.CU_STREAM_NON_BLOCKING)
            side = check(d.cuStreamCreate(flags), "cuStreamCreate(notify)")
            self._notify[key] = side
        return side

    def arm(self, events: Sequence[Any], stream: Any) -> int:
        """A descriptor that becomes readable once every one of ``events`` is done
        (``stream``: the work stream the first was recorded on)."""
        side = self._stream_for(stream)
        wait = cu().cuStreamWaitEvent
        for event in events:
            check(wait(side, event, 0), "cuStreamWaitEvent(notify)")
        read_end, write_end = os.pipe()
        err = hot.notify_spin(side, write_end, self.spin_ns)
        if err:
            os.close(read_end)
            os.close(write_end)
            raise error_from(err, "cuLaunchHostFunc")
        self.armed += 1
        return read_end

    def close(self) -> None:
        """Destroy the notify streams (the driver finishes their pending work first),
        once the C thread holds none of their events (it is quick: work was synced)."""
        hot.notify_drain(5.0)
        d = cu()
        for side in self._notify.values():
            d.cuStreamDestroy(side)
        self._notify.clear()


class CudaCompletion(Generic[T]):
    """CUDA work that finishes later (the ``Completion`` protocol of ``server.py``).

    Args:
        events: Events recorded after the work (one per stream involved).
        finalize: Produces the result once the events are done (runs once, on the
            thread calling ``result()``); ``None`` gives ``None``.
        pool: Where the events go back after ``result()``/``release()``.
        notifier: Optional :class:`HostFuncNotifier`, for ``fileno()``.
        stream: The stream the (first) event was recorded on, for ``fileno()``.
        context: The CUDA context, made current in helper threads that ``wait``.
        on_error: Called with the typed error when an event reports one.
    """

    __slots__ = (
        "_context",
        "_error",
        "_events",
        "_fd",
        "_finalize",
        "_notifier",
        "_on_error",
        "_pool",
        "_ready",
        "_released",
        "_stream",
    )

    SPIN_SECONDS = 200e-6
    """How long ``add_done_callback`` polls before it arms the descriptor."""
    CHECK_SECONDS = 0.05
    """Poll period while armed (sticky errors skip the host function that wakes us)."""

    def __init__(
        self,
        events: Sequence[Any],
        finalize: Callable[[], T] | None = None,
        pool: EventPool | None = None,
        notifier: HostFuncNotifier | None = None,
        stream: Any = None,
        context: Any = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._events = list(events)
        self._on_error = on_error
        self._finalize = finalize
        self._pool = pool
        self._notifier = notifier
        self._stream = stream
        self._context = context
        self._ready = False
        self._error: BaseException | None = None
        self._fd = -1
        self._released = False

    def done(self) -> bool:
        """True once every event completed or one reported an error (never blocks)."""
        if self._ready:
            return True
        query = hot.event_query
        while self._events and not self._released:
            err = query(self._events[-1])
            if err == _NOT_READY:
                return False
            if err:
                self._fail(error_from(err, "cuEventQuery"))
                break
            if len(self._events) == 1:
                break
            self._retire(self._events.pop())
        self._ready = True
        return True

    def _fail(self, error: BaseException) -> None:
        self._error = error
        if self._on_error is not None:
            self._on_error(error)

    def _retire(self, event: Any) -> None:
        if self._pool is not None:
            self._pool.give(event)

    def wait(self, timeout: float | None) -> bool:
        """Block the calling (helper) thread up to ``timeout`` s; True once done."""
        if self.done():
            return True
        if self._context is not None:
            set_current(self._context)
        if timeout is None and self._fd < 0:
            return self._sync_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        return self._sleep_until(deadline)

    def _sync_all(self) -> bool:
        sync = cu().cuEventSynchronize
        for event in list(self._events):
            (err,) = sync(event)
            if err:
                self._fail(error_from(err, "cuEventSynchronize"))
                self._ready = True
                return True
        return self.done()

    def _sleep_until(self, deadline: float | None) -> bool:
        pause = 50e-6
        while not self.done():
            left = 0.5 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return False
            step = min(pause, left)
            if self._fd >= 0:
                select.select([self._fd], [], [], min(left, 0.5))
            else:
                time.sleep(step)
                pause = min(pause * 2, 0.01)
        return True

    def fileno(self) -> int:
        """A descriptor that becomes readable when the work is done (armed on first
        call). Stop watching it before ``result()``/``release()``, which close it."""
        if self._fd < 0 and not self._ready:
            if self._notifier is None or not self._events:
                return -1
            if self._context is not None:  # the notify stream belongs to our context
                set_current(self._context)
            self._fd = self._notifier.arm(self._events, self._stream)
        return self._fd

    calls_back_on_loop: Final = True
    """``add_done_callback`` calls back on the loop's thread (the watcher skips a hop)."""

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` on the running loop's thread once done, without blocking it and
        without threads: poll ``done()`` once per loop iteration for ``SPIN_SECONDS``
        (short waits), then watch ``fileno()`` (long waits), rechecking ``done()`` every
        ``CHECK_SECONDS``. Call it from the loop's thread."""
        _Watch(self, fn, running_loop()).start()  # asyncio's, or the trio adapter

    def result(self) -> T:
        """The finalized result, or the work's typed error. Only valid once ``done()``."""
        if not self.done():
            raise RuntimeError("CudaCompletion.result() called before done()")
        try:
            error = self._error
            if error is None:
                return self._finalize() if self._finalize is not None else None  # type: ignore[return-value]
        finally:
            self.release()
        try:
            raise error
        finally:  # the traceback keeps this frame: not the completion (which keeps the
            del error, self  # error), nor the error itself (a cycle until a collection)

    def release(self) -> None:
        """Give the events back and close the descriptor (idempotent, owner thread)."""
        if self._released:
            return
        self._released = True
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._error is None and self._ready:
            for event in self._events:
                self._retire(event)
        elif self._error is None:  # abandoned before done: the driver frees it later
            for event in self._events:
                cu().cuEventDestroy(event)
        self._events.clear()


class _Watch:
    """One ``add_done_callback`` in progress (see there)."""

    __slots__ = ("_completion", "_deadline", "_fd", "_fired", "_fn", "_loop", "_timer")

    def __init__(
        self,
        completion: CudaCompletion[Any],
        fn: Callable[[], None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._completion = completion
        self._fn = fn
        self._loop = loop
        self._deadline = time.perf_counter() + completion.SPIN_SECONDS
        self._fd = -1
        self._timer: asyncio.TimerHandle | None = None
        self._fired = False

    def start(self) -> None:
        if self._completion.done():
            self._fire()
        else:
            _sweep_for(self._loop).add(self)

    def _arm(self) -> None:
        """The wait outlasted the spin: watch the descriptor (off the sweep)."""
        try:
            self._fd = self._completion.fileno()
        except OSError:  # out of descriptors: keep to the periodic check
            self._fd = -1
        if self._fd >= 0:
            self._loop.add_reader(self._fd, self._check)
        self._schedule()

    def _schedule(self) -> None:
        period = self._completion.CHECK_SECONDS if self._fd >= 0 else 0.001
        self._timer = self._loop.call_later(period, self._check)

    def _check(self) -> None:
        if self._fired:
            return
        if self._completion.done():
            self._fire()
        elif (
            self._timer is None
            or self._timer.cancelled()
            or self._timer.when() <= self._loop.time()
        ):
            self._schedule()

    def _fire(self) -> None:
        if self._fired:
            return
        self._fired = True
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
        if self._timer is not None:
            self._timer.cancel()
        self._fn()


class _Sweep:
    """The short waits of one loop: every pending ``add_done_callback`` polled by one
    callback per loop iteration, oldest first, instead of one callback each.

    Under concurrency (64 tasks, each awaiting a small read) a callback per completion
    per iteration made each iteration cost a Python call and an event query per task
    still waiting, and the loop's time per request grew with the tasks in flight. The
    sweep stops after ``PEEK`` completions not done yet (work queued later rarely ends
    first), so an iteration costs the completions that ended plus a few queries. A
    completion past its spin (``SPIN_SECONDS``) leaves the sweep for its descriptor, as
    before, so a long kernel ahead never holds the ones behind it for longer than that.
    """

    __slots__ = ("_loop", "_queued", "_watches")

    PEEK = 2
    """Completions not done yet that one sweep looks at before it stops."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._watches: deque[_Watch] = deque()
        self._queued = False

    def add(self, watch: _Watch) -> None:
        self._watches.append(watch)
        if not self._queued:
            self._queued = True
            self._loop.call_soon(self._run)

    def _run(self) -> None:
        self._queued = False
        watches = self._watches
        now = time.perf_counter()
        pending = 0
        i = 0
        while i < len(watches):
            watch = watches[i]
            if watch._fired:
                del watches[i]
            elif watch._completion.done():
                del watches[i]
                watch._fire()  # may add to the sweep (a task's next short wait)
            elif now >= watch._deadline:
                del watches[i]
                watch._arm()
            else:
                pending += 1
                if pending >= self.PEEK:
                    break
                i += 1
        if watches and not self._queued:
            self._queued = True
            self._loop.call_soon(self._run)


_sweeps: weakref.WeakKeyDictionary[Any, _Sweep] = weakref.WeakKeyDictionary()


def _sweep_for(loop: asyncio.AbstractEventLoop) -> _Sweep:
    """The sweep of ``loop`` (asyncio's, uvloop's or trio's adapter), made on first use."""
    sweep = _sweeps.get(loop)
    if sweep is None:
        sweep = _sweeps[loop] = _Sweep(loop)
    return sweep
