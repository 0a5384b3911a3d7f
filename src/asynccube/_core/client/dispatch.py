"""How a client's command reaches the actor that owns the server: sent through the
channel with the calling task's stream, fired (fire-and-forget) or awaited, and, where a
server hook has blocking work to do first (compiling, loading, pinning memory), run
after that work in a worker thread, never on the loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..channel.channel import Channel
from ..values.stream_id import StreamId
from .jobs import JobThread

__all__ = ["Dispatch", "Job"]

Job = Callable[[], None]


class Dispatch:
    """The client's sending part, shared by its other parts."""

    __slots__ = ("_channel", "_jobs")

    def __init__(self, channel: Channel, jobs: JobThread) -> None:
        self._channel = channel
        self._jobs = jobs

    def fire(self, fn: Callable[..., Any], *args: Any) -> None:
        """Send ``fn(*args, stream)`` to the actor, fire-and-forget (its error is held
        for the calling task's stream)."""
        channel = self._channel
        channel.send(channel.fire, StreamId.current(), fn, *args)

    def request(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Send ``fn(*args, stream)`` to the actor; the future settles once the work it
        queued on the stream completed."""
        channel = self._channel
        return channel.request(channel.await_completion, StreamId.current(), fn, *args)

    async def after(
        self, job: Job, stream: StreamId, then: Callable[..., None], *args: Any
    ) -> None:
        """Run ``job`` in a worker thread (the actor waits, so order is kept), then
        ``then(*args)``. A failed job is held for ``stream``: it is raised by ``then`` when
        that is an awaited command, else at the next awaited command on the stream."""
        try:
            await self._jobs.run(job)
        except Exception as exc:
            channel = self._channel
            channel.hold(stream, exc)
            if then == channel.fire_writing:  # ==: each access makes a new bound method
                channel.taint(stream, args[1], exc)  # fire-and-forget: the command is
                return  # skipped, its error held and its buffers tainted
            if then == channel.fire:
                return
        self._channel.activate()  # another client's commands may have run meanwhile
        then(*args)
