"""The trio backend (imported only when a client opens under trio).

One :class:`TrioBackend`, with its :class:`~.trio_loop.TrioLoop`, per trio run (a
``RunVar``), shared by the clients opened in that run. It also makes
``StreamId.current()`` and graph captures tell trio tasks apart (each trio task gets
its own stream, as each asyncio task does).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from ..values import stream_id
from .trio_loop import TrioFuture, TrioLoop

__all__ = ["TrioBackend", "trio_backend"]

T = TypeVar("T")
_BACKEND: trio.lowlevel.RunVar[TrioBackend] = trio.lowlevel.RunVar("asynccube_backend")


class TrioBackend:
    """What the core needs, done with trio (see :class:`~.backend.Backend`)."""

    name = "trio"
    cancelled: tuple[type[BaseException], ...] = (trio.Cancelled, asyncio.CancelledError)
    thread_hint = "use trio.from_thread.run(fn, trio_token=client.loop.token)"

    def __init__(self) -> None:
        self.loop = TrioLoop(self)  # type: ignore[abstract]  # (the operations used)
        self._token = self.loop.token

    def on_loop(self) -> bool:
        """True in a task of the trio run that opened the client."""
        try:
            return trio.lowlevel.current_trio_token() is self._token
        except RuntimeError:  # another thread, or an asyncio task
            return False

    async def checkpoint(self) -> None:
        """``trio.lowlevel.checkpoint()``."""
        await trio.lowlevel.checkpoint()

    async def wait(self, fut: asyncio.Future[Any], within: float | None = None) -> None:
        """Until ``fut`` is done or ``within`` seconds passed (``fut`` is never cancelled)."""
        with trio.move_on_after(math.inf if within is None else within):
            await _done(fut)

    async def shield(self, fut: asyncio.Future[T]) -> T:
        """``fut``'s result; a cancelled caller leaves ``fut`` running."""
        await _done(fut)
        return fut.result()

    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """``trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)``: a cancelled
        caller abandons the thread, as with asyncio's ``run_in_executor``."""
        return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)


async def _done(fut: asyncio.Future[Any]) -> None:
    if isinstance(fut, TrioFuture):
        await fut.wait_done()
    elif not fut.done():  # pragma: no cover - every future of a trio client is a TrioFuture
        raise TypeError(f"{fut!r} does not belong to a trio client")


def trio_backend() -> TrioBackend:
    """The backend of the running trio run (made on first use)."""
    try:
        return _BACKEND.get()
    except LookupError:
        pass
    stream_id.set_task_finder(_trio_task)
    backend = TrioBackend()
    _BACKEND.set(backend)
    return backend


def _trio_task() -> object | None:
    try:
        return trio.lowlevel.current_task()
    except RuntimeError:
        return None
