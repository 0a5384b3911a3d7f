"""A worker thread for a client's blocking jobs (compiling, loading, pinning memory).

``loop.run_in_executor`` starts executor threads lazily with ``threading.Thread.start``,
which waits on the calling (loop) thread until the new thread runs, and that can take
milliseconds when other threads hold the GIL. This thread is started once, without
waiting, and hands results back through ``call_soon_threadsafe``.
"""

from __future__ import annotations

import _thread
import asyncio
import queue
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["JobThread"]

T = TypeVar("T")
_Item = tuple[Callable[[], Any], asyncio.Future[Any]] | None


class JobThread:
    """Runs blocking jobs one at a time on a worker thread of its own."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._started = False

    def run(self, job: Callable[[], T]) -> asyncio.Future[T]:
        """Queue ``job``; the future gives its result or its exception."""
        fut: asyncio.Future[T] = self._loop.create_future()
        if not self._started:
            self._started = True
            _thread.start_new_thread(self._work, ())
        self._queue.put((job, fut))
        return fut

    def close(self) -> None:
        """End the thread once the queued jobs are done."""
        if self._started:
            self._queue.put(None)

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            job, fut = item
            del item
            try:
                self._deliver(fut, job(), None)
            except BaseException as exc:
                self._deliver(fut, None, exc)
            del job, fut

    def _deliver(self, fut: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
        try:
            self._loop.call_soon_threadsafe(_settle, fut, value, error)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


def _settle(fut: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)
