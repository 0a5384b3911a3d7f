"""The table from client handles to memory slices, shared by every server.

The client mints a :class:`Handle` synchronously (it must return one at once, without a
round trip through the actor); the actor later binds the handle's id to a slice of the
memory manager. When the last Handle/Binding of an id is gone (on any thread), the id
lands on this table's release queue; the server drains it and drops the slice, either
at once (host: queued tasks hold their bindings) or once the device has passed the
slice's last use (CUDA: the cross-stream hook).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Generic, TypeVar

from ..errors import InvalidHandle
from ..values.slices import ReleaseQueue, SliceHandle
from ..values.stream_id import StreamId
from ..values.types import Binding, Handle

__all__ = ["SliceTable"]

M = TypeVar("M")
_owners = itertools.count(1)


class SliceTable(Generic[M]):
    """Client handle ids -> the memory slices (of type ``M``) behind them."""

    __slots__ = ("_ids", "_slices", "failed", "queue")

    def __init__(self) -> None:
        self.queue = ReleaseQueue(next(_owners))
        self._ids = itertools.count(1)
        self._slices: dict[int, M] = {}
        self.failed: dict[int, BaseException] = {}

    def new_handle(self, size: int, stream: StreamId) -> Handle:
        """Mint a handle of ``size`` bytes (memory is bound later by the actor)."""
        return Handle(SliceHandle(next(self._ids), self.queue), None, None, stream, 0, size)

    def bind(self, handle_id: int, memory: M) -> None:
        """Record the memory behind ``handle_id``."""
        self._slices[handle_id] = memory

    def fail(self, handle_id: int, error: BaseException) -> None:
        """Record that the allocation of ``handle_id`` failed."""
        self.failed[handle_id] = error

    def get(self, binding: Binding | Handle) -> M:
        """The memory behind ``binding``, or InvalidHandle saying why there is none."""
        token = binding.memory
        memory = self._slices.get(token.id)
        if memory is not None and token.queue is self.queue:
            return memory
        raise InvalidHandle(self._why_invalid(binding))

    def _why_invalid(self, binding: Binding | Handle) -> str:
        token = binding.memory
        if token.queue is not self.queue:
            return (
                f"{binding!r} belongs to another client (or to a closed one); "
                "use handles only with the client that created them"
            )
        if self.queue.closed:
            return f"{binding!r} belongs to a closed client"
        cause = self.failed.get(token.id)
        if cause is not None:
            return f"the allocation of {binding!r} failed: {cause}"
        return f"{binding!r} has no memory (it was freed)"

    def drain(self, release: Callable[[int, M], None]) -> None:
        """Pass each released id and its memory to ``release`` (owner thread only)."""
        if not len(self.queue):
            return
        for handle_id in self.queue.drain():
            memory = self._slices.pop(handle_id, None)
            self.failed.pop(handle_id, None)
            if memory is not None:
                release(handle_id, memory)

    def close(self) -> None:
        """Invalidate every handle and forget all slices."""
        self.queue.closed = True
        self._slices.clear()
        self.failed.clear()

    def __len__(self) -> int:
        return len(self._slices)
