"""What a channel's queued commands touch: their streams and their buffers.

A command sent with ``Channel.send_tracked`` says which stream it runs on (its
StreamId's value) and which buffers it binds (their memory ids). When it must wait in
the queue it goes there as a :class:`Tracked` op, and the channel's :class:`Footprint`
counts, for the tracked commands waiting in its queue, how many are on each stream and
how many bind each buffer; a tracked command leaves the count when it runs (the actor's
drain, ``run_queued_inline``, or inline). One that runs at once needs no record.

The count lets a command run ahead of the queue where ordering allows it: when every
queued command is tracked (nothing else waits: no sync, no close, no compile the actor
awaits, no command of unknown reach) and none of them is on the command's stream or
binds one of its buffers, the command cannot overtake its own stream's work, nor read
or write a buffer before a command sent earlier that touches it. Then ``Channel.send``
runs a tracked command inline (within the iteration's budget, as for an idle actor),
and the servers' one-call routes (``cuda/fast.py``) take their launch, small read or
allocation. Otherwise both behave as before: the command waits behind the queue.

Errors keep their order: a fire-and-forget command's error is held for its own stream
and raised there (a command of another stream running first never raises it), and a
buffer a queued command may taint is one a command running ahead cannot bind. Streams
that share a device stream (ids equal modulo ``max_streams``) keep their cursors in
order there: a command that runs ahead is issued, and stamped, before the queued ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Footprint", "Tracked"]


class Footprint:
    """The streams and buffers of a channel's queued tracked commands (see above).

    ``queued``, ``streams`` and ``buffers`` are read by the compiled one-call routes
    (the dicts by identity: never replaced).
    """

    __slots__ = ("buffers", "queued", "streams")

    def __init__(self) -> None:
        self.queued = 0
        """Tracked commands counted in (waiting in the queue)."""
        self.streams: dict[int, int] = {}
        """StreamId value -> tracked commands queued on it."""
        self.buffers: dict[int, int] = {}
        """Memory id -> tracked commands queued that bind it."""

    def clear_of(self, queue_length: int, stream: int, mids: Sequence[int]) -> bool:
        """True when every queued command is tracked and none is on ``stream`` or binds
        one of ``mids``."""
        if queue_length != self.queued or stream in self.streams:
            return False
        buffers = self.buffers
        return all(m not in buffers for m in mids)

    def add(self, stream: int, mids: Sequence[int]) -> None:
        """Count a tracked command in (it was queued)."""
        self.queued += 1
        streams = self.streams
        streams[stream] = streams.get(stream, 0) + 1
        buffers = self.buffers
        get = buffers.get
        for m in mids:
            buffers[m] = get(m, 0) + 1

    def remove(self, stream: int, mids: Sequence[int]) -> None:
        """Count a tracked command out (it runs now)."""
        self.queued -= 1
        streams = self.streams
        n = streams[stream] - 1
        if n:
            streams[stream] = n
        else:
            del streams[stream]
        buffers = self.buffers
        for m in mids:
            n = buffers[m] - 1
            if n:
                buffers[m] = n
            else:
                del buffers[m]


class Tracked:
    """A command whose stream and buffers its channel's :class:`Footprint` counts while
    it waits in the queue: ``Tracked(...)(*args)`` runs ``op(*args)``."""

    __slots__ = ("counted", "footprint", "mids", "op", "stream")

    def __init__(
        self, footprint: Footprint, stream: int, mids: Sequence[int], op: Callable[..., Any]
    ) -> None:
        self.footprint = footprint
        self.stream = stream
        self.mids = mids
        self.op = op
        self.counted = False
        """True while counted in the footprint (set when ``Channel.send`` queues it; a
        command an exclusive block held and queued later is not: it counts as a command
        of unknown reach, so nothing runs ahead of it)."""

    def clear(self, queue_length: int) -> bool:
        """True when this command may run ahead of the queue (see the module)."""
        return self.footprint.clear_of(queue_length, self.stream, self.mids)

    def enqueue(self) -> None:
        """Count this command in (``Channel.send`` queues it)."""
        self.footprint.add(self.stream, self.mids)
        self.counted = True

    def __call__(self, *args: Any) -> Any:
        if self.counted:
            self.counted = False
            self.footprint.remove(self.stream, self.mids)
        return self.op(*args)
