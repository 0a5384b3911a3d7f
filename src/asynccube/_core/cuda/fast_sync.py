"""``client.sync()`` in one call when the device is (nearly) done: :class:`FastSync`.

The route (``ComputeClient.sync`` -> ``Channel.request`` -> ``await_completion`` ->
``CudaServer.sync``) records an event on every stream with work not yet known done and
hands a completion to the watcher. When that work ends within a few µs (a sync right
after a short kernel), most of the cost is that machinery. ``FastSync`` polls each such
stream directly (``cuStreamQuery``, through the hot path) for up to 30 µs, as the
watcher's first spin does, and returns a future resolved one loop step later (not at
once, so that tasks cancelled before the sync have unwound when it returns:
:func:`settle_none`). It runs only where the route would run the sync inline with nothing else
to do first: the channel open, called on its loop, no capture, the actor idle with
nothing queued, no error held (the route raises it), no graphs to release, the device's
context current as ``driver.set_current`` left it. Anything else, a stream not done
within the spin or a stream in error, returns None and the route takes the sync (the
server's collection of dropped handles, run first by both, is idempotent).

Plain Python over the hot path's ``stream_query``: the same code for the compiled
module and its twin.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Final

from . import driver
from .native.hotpath import hot

if TYPE_CHECKING:
    from ..channel.channel import Channel
    from .state import ServerCore

__all__ = ["FastSync", "settle_none"]

SPIN_S: Final = 30e-6
"""How long the streams are polled (as ``CompletionWatcher``'s ``sync_spin_seconds``)."""
_NOT_READY: Final = 600  # CUDA_ERROR_NOT_READY
_get_running_loop = asyncio._get_running_loop


def settle_none(fut: asyncio.Future[None]) -> None:
    """Resolve a sync's future (unless its caller cancelled it) one loop step after
    the sync was found done, never at once: the tasks cancelled before the sync (their
    wake-ups are queued ahead of this) unwind first, and the loop lets go of the
    callback that resumed the caller (the loop holds it for the rest of its step: a
    ``gather`` of cancelled tasks, say, whose errors' tracebacks hold their frames), so
    the handles those held are dropped, and the next ``memory_usage()`` counts them as
    free (the sync marked every stream done, so their slices are released at once)."""
    if not fut.done():
        fut.set_result(None)


class FastSync:
    """``fast_sync() -> a resolved future, or None`` for one client (see above)."""

    __slots__ = ("_channel", "_context", "_new_future", "_on_loop", "_open", "_server",
                 "declined", "hits")  # fmt: skip

    def __init__(self, server: ServerCore, channel: Channel) -> None:
        from ..channel.channel import State

        self._server = server
        self._channel = channel
        self._open = State.OPEN
        self._context = server._ctx.context
        self._on_loop = None if channel.backend.name == "asyncio" else channel.backend.on_loop
        self._new_future = channel.future_factory()
        self.hits = 0
        self.declined = 0

    def __call__(self) -> asyncio.Future[None] | None:
        if not self._ready() or not self._all_done():
            self.declined += 1
            return None
        c = self._channel
        fut: asyncio.Future[None] = self._new_future()
        c.loop.call_soon(settle_none, fut)  # one loop step: see settle_none
        c.ran_inline()
        self.hits += 1
        return fut

    def _ready(self) -> bool:
        c = self._channel
        if c.state is not self._open or c.guard is not None or not c.idle():
            return False
        if c._stop or c._held:
            return False
        if _get_running_loop() is not c.loop and (self._on_loop is None or not self._on_loop()):
            return False
        return getattr(driver._tls, "context", None) is self._context

    def _all_done(self) -> bool:
        """Poll every stream with work not known done; mark them done if all finished."""
        server = self._server
        server._collect()
        marks = [(w, w.cursor) for _, w in server._streams.streams.existing() if w.cursor != w.done]
        end = time.perf_counter() + SPIN_S
        query = hot.stream_query  # cuStreamQuery
        for wrapper, _ in marks:
            while True:
                err = int(query(wrapper.stream))
                if err == 0:
                    break
                if err != _NOT_READY or time.perf_counter() >= end:
                    return False  # the route waits (or raises the stream's error)
        server._streams.mark_done(marks)
        return True
