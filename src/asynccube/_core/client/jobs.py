"""A worker thread for a client's blocking jobs (compiling, loading, pinning memory).

``loop.run_in_executor`` starts executor threads lazily with ``threading.Thread.start``,
which waits on the calling (loop) thread until the new thread runs, and that can take
milliseconds when other threads hold the GIL. This thread is started once, without
waiting, and hands results back through ``call_soon_threadsafe`` (as the process's
blocking pool does: :mod:`..channel.blocking`, whose ``deliver`` it uses).
"""

from __future__ import annotations

import _thread
import asyncio
import queue
from collections.abc import Callable
from typing import Any, TypeVar

from ..channel.blocking import deliver

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
                deliver(self._loop, fut, job(), None)
            except BaseException as exc:
                deliver(self._loop, fut, None, exc)
            del job, fut
