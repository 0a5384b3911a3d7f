"""Blocking jobs off an asyncio loop, in threads that never make the loop wait to start.

``loop.run_in_executor(None, ...)`` starts the default executor's threads lazily with
``threading.Thread.start``, which waits on the calling thread, the loop's, until the new
thread runs: 2 to 7 ms a thread on a loaded 2-core host (measured: eight submits in a
row while a test suite ran beside them), and ``asyncio.run`` makes a new executor, so new
threads, for every loop (every test of a pytest-asyncio suite). Opening a client runs two
or three such jobs (the configuration, the settings, a GPU's import and build), so the
loop-lag probe failed an open now and then on CI (reruns in most CI runs of
``test_collectives.py`` and ``test_close_pending.py``).

:class:`BlockingPool` is one per process: its threads are started with
``_thread.start_new_thread`` (which does not wait), one more only when none is idle, up
to :data:`MAX_THREADS`, and kept; each job's result goes back to its loop through
``call_soon_threadsafe`` (dropped where that loop has closed). A job whose future was
cancelled before a thread took it is skipped; a running job is not interrupted (as with
asyncio's executor). After ``os.fork`` the child starts with no thread and an empty
queue (the parent's threads do not exist there).

Unlike asyncio's default executor, the pool is not the one ``loop.set_default_executor``
sets, ``asyncio.run`` does not wait for its running jobs when it ends, and its threads are
not joined at interpreter exit: a job still running then (one whose caller was
cancelled, say) ends with the process, as a daemon thread does.

The channel's per-client job thread (:mod:`..client.jobs`) and the exclusive block's
thread start theirs the same way; this pool is for :func:`.backend.run_blocking` and
the asyncio backend's ``run_sync`` and ``to_thread``.
"""

from __future__ import annotations

import _thread
import asyncio
import os
import queue
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final

__all__ = ["MAX_THREADS", "BlockingPool", "Unraisable", "deliver", "pool"]

MAX_THREADS: Final = 16
"""Threads the pool starts at most (more jobs at once wait in its queue)."""

_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


class BlockingPool:
    """Worker threads for blocking jobs of any asyncio loop (see the module docstring)."""

    def __init__(self, limit: int = MAX_THREADS) -> None:
        self._limit = limit
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        """Threads started (all alive: they never end)."""
        self._idle = 0
        """Threads waiting for a job that no submit has claimed."""
        self._backlog = 0
        """Jobs queued while every thread was busy and no more could start."""

    @property
    def threads(self) -> int:
        """How many threads the pool has started."""
        return self._threads

    def submit(
        self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any
    ) -> asyncio.Future[Any]:
        """``fn(*args)`` on a pool thread; a future of ``loop`` for its result (call on
        ``loop``'s thread). Cancelling the future before a thread takes the job skips
        it."""
        fut = loop.create_future()
        with self._lock:
            if self._idle:
                self._idle -= 1
                start = False
            elif self._threads < self._limit:
                self._threads += 1
                start = True
            else:
                self._backlog += 1
                start = False
        if start:  # before the job is queued: a start that fails leaves nothing behind
            try:
                _thread.start_new_thread(self._work, ())
            except BaseException:  # "can't start new thread": the caller gets it
                with self._lock:
                    self._threads -= 1
                raise
        self._jobs.put((loop, fut, fn, args))
        return fut

    def _work(self) -> None:
        get = self._jobs.get
        while True:  # never ends: a counted thread that died would strand a job
            loop, fut, fn, args = get()
            value, error = None, None
            if not fut.cancelled():  # a read of its state: the loop's thread owns it
                try:
                    value = fn(*args)
                except BaseException as exc:  # the awaiting task raises it
                    error = exc
            with self._lock:  # free before the caller hears: its next job finds it idle
                if self._backlog:
                    self._backlog -= 1  # a queued job nobody claimed: take it next
                else:
                    self._idle += 1
            try:
                if not fut.cancelled():
                    deliver(loop, fut, value, error)
            except BaseException as exc:  # a loop's own failure: reported, the thread serves on
                what = "handing a blocking job's result to its loop"
                sys.unraisablehook(Unraisable(exc, what, deliver))
            del loop, fut, fn, args, value, error  # nothing of the job kept while idle


class Unraisable:
    """The ``sys.unraisablehook`` argument for an error nobody can be given: raised on a
    thread whose caller is gone (``what``: what was being done; ``where``: the callable)."""

    __slots__ = ("err_msg", "exc_traceback", "exc_type", "exc_value", "object")

    exc_type: type[BaseException]
    exc_value: BaseException | None
    exc_traceback: TracebackType | None
    err_msg: str | None
    object: object

    def __init__(self, exc: BaseException, what: str, where: Callable[..., Any]) -> None:
        self.exc_type, self.exc_value, self.exc_traceback = type(exc), exc, exc.__traceback__
        self.err_msg = f"Exception ignored while {what}"
        self.object = where


def deliver(
    loop: asyncio.AbstractEventLoop,
    fut: asyncio.Future[Any],
    value: Any,
    error: BaseException | None,
) -> None:
    """Settle ``fut`` (of ``loop``) with ``value`` or ``error`` from another thread,
    through ``call_soon_threadsafe``; nothing where ``loop`` has closed (nobody waits any
    more) or ``fut`` is done by then (cancelled while the job ran)."""
    try:
        loop.call_soon_threadsafe(_settle, fut, value, error)
    except RuntimeError:  # the loop has closed: nobody waits for it any more
        pass


def _settle(fut: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if fut.done():  # cancelled while the job ran
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


pool: Final = BlockingPool()
"""The process's pool."""
