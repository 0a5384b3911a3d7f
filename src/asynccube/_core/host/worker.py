"""Host streams: one worker thread per stream, running tasks in order.

These are the host server's streams and events (its ``EventStreamBackend``): ``flush``
enqueues a task that sets a ``threading.Event``; ``wait_event`` enqueues a task that waits
for one. Workers never run on the event-loop thread.
"""

from __future__ import annotations

import _thread
import itertools
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ..errors import AsyncCubeError, ExecutionError

__all__ = ["Afterwards", "HostBackend", "HostCompletion", "HostStream"]

T = TypeVar("T")
MAX_BATCH = 256
"""Tasks a stream buffers before handing them to its worker (cubecl's ``max_tasks``)."""
Task = Callable[[], object]


class Afterwards:
    """What a task returns to have ``fn(arg)`` run once its worker counts it finished: a
    completion's result (:func:`.tasks.completing`: ``done.set_result, value``), so that
    whoever it wakes (a read's caller exporting the buffer next, say) finds the stream
    idle, not still running the task that woke it."""

    __slots__ = ("arg", "fn")

    def __init__(self, fn: Callable[[Any], object], arg: Any) -> None:
        self.fn, self.arg = fn, arg


_names = itertools.count()


class HostCompletion(Generic[T]):
    """A result produced on a worker thread; implements the ``Completion`` protocol and
    notifies callbacks (on the worker thread) when done."""

    __slots__ = ("_callbacks", "_error", "_event", "_lock", "_value", "held_mark")

    def __init__(self) -> None:
        self.held_mark = 0
        """The last error held (``HeldErrors.mark``) when the work ran (set by the task)."""
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], object]] = []
        self._value: T | None = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        """True once a result or an error is set."""
        return self._event.is_set()

    def result(self) -> T:
        """The result, or raise the error."""
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def wait(self, timeout: float | None) -> bool:
        """Block until done (helper threads only)."""
        return self._event.wait(timeout)

    def add_done_callback(self, fn: Callable[[], object]) -> None:
        """Call ``fn()`` once done: now if already done, else on the finishing thread."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(fn)
                return
        fn()

    def set_result(self, value: T) -> None:
        """Complete with ``value``."""
        self._value = value
        self._finish()

    def set_error(self, error: BaseException) -> None:
        """Complete with ``error``."""
        self._error = error
        self._finish()

    def _finish(self) -> None:
        with self._lock:
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn()


class HostStream:
    """A worker thread that runs its tasks in submission order.

    Tasks submitted during one batch of the actor are buffered and handed to the worker
    together at ``flush()`` (one wake-up per batch, not per task). A task that raises
    does not stop the stream, whatever it raises (a ``BaseException`` such as
    ``SystemExit`` included: the thread would end, and every later task of the stream
    with it, and ``close()`` would wait for it forever): the first error is held (later
    ones are attached as notes) until an awaited operation on this stream takes it.
    """

    __slots__ = ("_batch", "_dirty", "_errors", "_queue", "finished", "name", "submitted")

    def __init__(self, dirty: set[HostStream]) -> None:
        self.name = f"asynccube-host-{next(_names)}"
        self._queue: queue.SimpleQueue[list[Task] | None] = queue.SimpleQueue()
        self._batch: list[Task] = []
        self._dirty = dirty
        self._errors: list[BaseException] = []
        self.submitted = 0  # written by the loop thread only
        self.finished = 0  # written by the worker only: idle when both are equal
        # Not threading.Thread.start(): it waits until the new thread runs, which can take
        # milliseconds on a loaded machine, and this is called on the event loop.
        _thread.start_new_thread(self._run, ())

    def __repr__(self) -> str:
        return f"HostStream({self.name})"

    def submit(self, task: Task) -> None:
        """Run ``task`` after everything submitted before it (once flushed; a batch is
        handed over by itself once it holds ``MAX_BATCH`` tasks)."""
        batch = self._batch
        self.submitted += 1
        if not batch:
            self._dirty.add(self)
        batch.append(task)
        if len(batch) >= MAX_BATCH:
            self.flush()

    def flush(self) -> None:
        """Hand the buffered tasks to the worker."""
        if self._batch:
            self._queue.put(self._batch)
            self._batch = []
        self._dirty.discard(self)

    def take_error(self) -> BaseException | None:
        """The held error (cleared), with later errors attached as notes (worker only)."""
        if not self._errors:
            return None
        first, *rest = self._errors
        self._errors.clear()
        for other in rest:
            first.add_note(f"also failed on this stream: {type(other).__name__}: {other}")
        return first

    def stop(self, on_exit: Task) -> None:
        """Finish queued tasks, call ``on_exit`` on the worker, then end the thread."""
        self.submit(on_exit)
        self.flush()
        self._queue.put(None)

    def _run(self) -> None:
        get = self._queue.get
        while (batch := get()) is not None:
            batch.reverse()
            while batch:  # pop each task so that nothing keeps it (or its bindings) alive
                self._run_task(batch.pop())

    def _run_task(self, task: Task) -> None:
        then: object = None
        try:
            then = task()
        except BaseException as exc:  # SystemExit & co. too: nothing ends the worker
            self._hold(exc)
        finally:
            self.finished += 1
        if type(then) is Afterwards:  # a completion's result: the task counts as finished
            try:
                then.fn(then.arg)
            except BaseException as exc:
                self._hold(exc)

    def _hold(self, exc: BaseException) -> None:
        if isinstance(exc, AsyncCubeError):
            self._errors.append(exc)
            return
        err = ExecutionError(f"{type(exc).__name__}: {exc}")
        err.__cause__ = exc
        self._errors.append(err)


class HostBackend:
    """The host's ``EventStreamBackend``: worker threads and ``threading.Event``s."""

    def __init__(self) -> None:
        self.dirty: set[HostStream] = set()

    def create_stream(self) -> HostStream:
        """A new worker thread."""
        return HostStream(self.dirty)

    def flush(self, stream: HostStream) -> threading.Event:
        """An event set once the stream's work so far is done."""
        event = threading.Event()
        stream.submit(event.set)
        stream.flush()
        return event

    def wait_event(self, stream: HostStream, event: threading.Event) -> None:
        """Make the stream's later work wait for ``event``."""
        stream.submit(event.wait)

    def wait_event_sync(self, event: threading.Event) -> None:
        """Block until ``event`` (helper threads only)."""
        event.wait()

    def idle(self, streams: list[HostStream]) -> bool:
        """True when none of ``streams`` has work submitted and not yet finished."""
        return all(s.submitted == s.finished for s in streams)

    def flush_dirty(self) -> None:
        """Hand every stream's buffered tasks to its worker."""
        for stream in list(self.dirty):
            stream.flush()
