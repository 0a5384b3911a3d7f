"""The loop a client drives under trio: the few asyncio loop operations the core uses,
done with trio's low-level API (imported only when trio runs; trio stays optional).

* :class:`TrioFuture` is an :class:`asyncio.Future` that a trio task can await: the task
  parks in ``trio.lowlevel.wait_task_rescheduled`` and ``set_result``/``set_exception``/
  ``cancel`` reschedule it directly (no callback hop). Cancelling the awaiting trio task
  cancels the future, as cancelling an asyncio task does, so the channel drops it.
* ``call_soon``/``call_later`` callbacks (asyncio :class:`~asyncio.Handle` objects, so a
  failing callback is reported, not fatal) run in one trio system task per run, which
  sleeps while there is nothing to do; ``call_soon_threadsafe`` goes through
  ``TrioToken.run_sync_soon`` (trio's wakeup, as asyncio's self-pipe).
* ``create_task`` starts a system task (it outlives the user's nurseries, and trio
  cancels it when the run ends); the returned :class:`TrioTask` is a future of its result.
* ``add_reader`` watches a descriptor with ``trio.lowlevel.wait_readable`` in a system
  task; ``remove_reader`` cancels it (synchronously: the descriptor can be closed next).
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar, TypeVarTuple

import trio

from ..errors import LoopMismatchError
from .awaitable import WatchedFuture

__all__ = ["TrioClientFuture", "TrioFuture", "TrioLoop", "TrioTask"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")
_log = logging.getLogger("asynccube")
_SUCCEEDED = trio.lowlevel.Abort.SUCCEEDED
_reschedule = trio.lowlevel.reschedule
_current_task = trio.lowlevel.current_task
_wait = trio.lowlevel.wait_task_rescheduled


class TrioFuture(asyncio.Future[T]):
    """An asyncio future (same API, same states) that trio tasks await."""

    __slots__ = ("_parked",)

    def __init__(self, *, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self._parked: list[Any] | None = None

    def __await__(self) -> Generator[Any, None, T]:
        if not self.done():
            yield from self._park(cancel=True).__await__()
        if self.cancelled() or self.exception() is None:
            return self.result()
        error = self.exception()
        del self  # the traceback keeps this frame: not the future, which keeps the error
        try:
            raise error  # type: ignore[misc]
        finally:
            del error  # nor the error itself: a frame holding its own error is a cycle

    __iter__ = __await__

    async def wait_done(self) -> None:
        """Wait until done without cancelling the future if the waiter is cancelled."""
        if not self.done():
            await self._park(cancel=False)

    async def _park(self, cancel: bool) -> None:
        try:
            task = _current_task()
        except RuntimeError:
            raise LoopMismatchError(
                "an asynccube future of a client opened under trio was awaited outside "
                "trio; await it in a task of the trio run that opened the client"
            ) from None
        parked = self._parked
        if parked is None:
            parked = self._parked = []
        parked.append(task)

        def abort(_: Any) -> trio.lowlevel.Abort:
            parked.remove(task)
            if cancel:
                self.cancel()  # as asyncio: a cancelled awaiter cancels what it awaits
            return _SUCCEEDED

        await _wait(abort)

    def _wake(self) -> None:
        parked, self._parked = self._parked, None
        if parked:
            for task in parked:
                _reschedule(task)

    def set_result(self, result: T) -> None:
        """As :meth:`asyncio.Future.set_result`; wakes the trio tasks awaiting it."""
        super().set_result(result)
        if self._parked:
            self._wake()

    def set_exception(self, exception: type | BaseException) -> None:
        """As :meth:`asyncio.Future.set_exception`; wakes the awaiting trio tasks."""
        super().set_exception(exception)
        if self._parked:
            self._wake()

    def cancel(self, msg: Any | None = None) -> bool:
        """As :meth:`asyncio.Future.cancel`; wakes the awaiting trio tasks."""
        cancelled = super().cancel(msg)
        if self._parked:
            self._wake()
        return cancelled


class TrioClientFuture(WatchedFuture, TrioFuture[T]):
    """An awaitable of a client under trio (see :mod:`.awaitable`)."""

    __slots__ = ("_ac_from", "_ac_seen", "_ac_stream")

    def __await__(self) -> Generator[Any, None, T]:
        self._ac_seen = True
        return TrioFuture.__await__(self)

    __iter__ = __await__


class TrioTask(TrioFuture[T]):
    """A coroutine running as a trio system task, seen as a future of its result.
    ``cancel()`` cancels the coroutine; the future is cancelled once it has ended."""

    __slots__ = ("_name", "_scope")

    def __init__(self, *, loop: asyncio.AbstractEventLoop, name: str | None) -> None:
        super().__init__(loop=loop)
        self._scope = trio.CancelScope()
        self._name = name

    def get_name(self) -> str | None:
        """The name it was created with."""
        return self._name

    def cancel(self, msg: Any | None = None) -> bool:
        """Ask the coroutine to stop (trio cancellation); False once it has ended."""
        if self.done():
            return False
        self._scope.cancel()
        return True

    async def _main(self, coro: Coroutine[Any, Any, T]) -> None:
        try:
            with self._scope:
                value = await coro
        except trio.Cancelled:
            super().cancel()  # the run is ending: note it, and let trio finish the task
            raise
        except BaseException as exc:
            if not self.done():
                super().set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        if self._scope.cancelled_caught:
            super().cancel()
        elif not self.done():
            self.set_result(value)


class TrioLoop(asyncio.AbstractEventLoop):
    """The asyncio loop operations the core uses, on one trio run (see the module
    docstring). Callbacks run on the trio thread, in one system task."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        """The :class:`~.trio_backend.TrioBackend` that owns this loop."""
        self.token = trio.lowlevel.current_trio_token()
        """The run's ``TrioToken`` (``trio.from_thread.run(..., trio_token=loop.token)``)."""
        self._ready: deque[asyncio.Handle] = deque()
        self._timers: list[asyncio.TimerHandle] = []
        self._sleeper: Any = None
        self._readers: dict[int, trio.CancelScope] = {}
        trio.lowlevel.spawn_system_task(self._serve, name="asynccube-trio-loop")

    # -- what the core calls --------------------------------------------------------------

    client_future_class = TrioClientFuture
    """The class of the awaitables a client returns (see :mod:`.awaitable`)."""

    def create_future(self) -> asyncio.Future[Any]:
        """A future that trio tasks can await."""
        return TrioFuture(loop=self)

    def create_task(  # type: ignore[override]
        self, coro: Coroutine[Any, Any, T], *, name: str | None = None, context: Any = None
    ) -> asyncio.Task[T]:
        """Run ``coro`` as a trio system task; a future of its result."""
        task: TrioTask[T] = TrioTask(loop=self, name=name)
        if context is None:
            context = contextvars.copy_context()  # as asyncio: the task sees the caller's
        trio.lowlevel.spawn_system_task(task._main, coro, name=name, context=context)
        return task  # type: ignore[return-value]  # the Task API the core uses: a Future's

    def call_soon(
        self,
        callback: Callable[[*Ts], object],
        *args: *Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        """Run ``callback(*args)`` soon, on the trio thread."""
        handle = asyncio.Handle(callback, args, self, context)
        self._ready.append(handle)
        self._wake_server()
        return handle

    def call_soon_threadsafe(
        self,
        callback: Callable[[*Ts], object],
        *args: *Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        """``call_soon`` from any thread (RuntimeError once the run has ended)."""
        handle = asyncio.Handle(callback, args, self, context)
        self.token.run_sync_soon(handle._run)  # RunFinishedError is a RuntimeError
        return handle

    def call_later(
        self,
        delay: float,
        callback: Callable[[*Ts], object],
        *args: *Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        """Run ``callback(*args)`` after ``delay`` seconds."""
        return self.call_at(self.time() + delay, callback, *args, context=context)

    def call_at(
        self,
        when: float,
        callback: Callable[[*Ts], object],
        *args: *Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        """Run ``callback(*args)`` at ``when`` (:meth:`time`'s clock)."""
        handle = asyncio.TimerHandle(when, callback, args, self, context)
        heapq.heappush(self._timers, handle)
        self._wake_server()
        return handle

    def time(self) -> float:
        """The monotonic clock of ``call_at``."""
        return time.monotonic()

    def add_reader(self, fd: Any, callback: Callable[[*Ts], object], *args: *Ts) -> None:
        """Call ``callback(*args)`` whenever ``fd`` is readable, until removed."""
        self.remove_reader(fd)
        scope = self._readers[fd] = trio.CancelScope()
        handle = asyncio.Handle(callback, args, self, None)
        trio.lowlevel.spawn_system_task(self._watch_fd, fd, handle, scope, name="asynccube-fd")

    def remove_reader(self, fd: Any) -> bool:
        """Stop watching ``fd`` (at once: it may be closed right after)."""
        scope = self._readers.pop(fd, None)
        if scope is None:
            return False
        scope.cancel()
        return True

    # -- what asyncio's futures and handles call --------------------------------------------

    def get_debug(self) -> bool:
        """Never in asyncio debug mode."""
        return False

    def is_running(self) -> bool:
        """True: the adapter exists only inside its trio run."""
        return True

    def is_closed(self) -> bool:
        """False (see :meth:`is_running`)."""
        return False

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        """A timer was cancelled: it is skipped when it comes due."""

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        """Log what asyncio would report (a failing callback, an unretrieved error)."""
        exc = context.get("exception")
        _log.error("%s", context.get("message", "error in a trio-loop callback"), exc_info=exc)

    # -- the system tasks ------------------------------------------------------------------

    def _wake_server(self) -> None:
        sleeper = self._sleeper
        if sleeper is not None:
            self._sleeper = None
            _reschedule(sleeper)

    async def _serve(self) -> None:
        ready, timers = self._ready, self._timers
        while True:
            if not ready:
                await self._sleep()
            if timers:
                now = self.time()
                while timers and timers[0].when() <= now:
                    due = heapq.heappop(timers)
                    if not due.cancelled():
                        ready.append(due)
            for _ in range(len(ready)):
                handle = ready.popleft()
                if not handle.cancelled():
                    handle._run()
            # Keep no handle while asleep (as asyncio's loop): the last one would keep its
            # callback's arguments alive, a settled future and the frames of its error.
            handle = due = None  # type: ignore[assignment]
            if ready:  # callbacks queued more: let the other tasks run first
                await trio.lowlevel.checkpoint()

    async def _sleep(self) -> None:
        """Until ``call_soon`` wakes it, or the first timer is due."""
        timers = self._timers
        while timers and timers[0].cancelled():
            heapq.heappop(timers)
        self._sleeper = _current_task()
        if not timers:  # the common case: no cancel scope to enter and leave
            await _wait(self._abort_sleep)
            return
        delay = max(0.0, timers[0].when() - self.time())
        with trio.CancelScope(deadline=trio.current_time() + delay):
            await _wait(self._abort_sleep)

    def _abort_sleep(self, _: Any) -> trio.lowlevel.Abort:
        self._sleeper = None
        return _SUCCEEDED

    async def _watch_fd(self, fd: int, handle: asyncio.Handle, scope: trio.CancelScope) -> None:
        # remove_reader may run before this task starts, and the descriptor be closed
        # then: never wait on it once the scope is cancelled.
        with scope:
            while not scope.cancel_called:
                try:
                    await trio.lowlevel.wait_readable(fd)
                except OSError as exc:  # closed behind our back: report, stop watching
                    self.call_exception_handler({"message": f"fd {fd}", "exception": exc})
                    return
                handle._run()
