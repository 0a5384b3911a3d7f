"""A bounded pool of streams, created lazily (cubecl's ``StreamPool``).

Stream ids map onto ``max_streams`` slots (index = id mod max_streams), so any number of
short-lived tasks shares a bounded set of device streams. Special slots (the GC stream)
sit after the regular ones.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from ..errors import InvalidArgument
from ..values.stream_id import StreamId

__all__ = ["StreamFactory", "StreamPool"]

S = TypeVar("S")
S_co = TypeVar("S_co", covariant=True)


class StreamFactory(Protocol[S_co]):
    """Creates the streams of a pool."""

    def create(self) -> S_co:
        """Make a new stream."""
        ...


class StreamPool(Generic[S]):
    """``max_streams`` regular slots plus ``num_special`` special ones, filled lazily."""

    __slots__ = ("_created", "_factory", "max_streams", "slots")

    def __init__(self, factory: StreamFactory[S], max_streams: int, num_special: int) -> None:
        if not 1 <= max_streams <= 1024:
            raise InvalidArgument(f"max_streams must be in [1, 1024], got {max_streams}")
        self._factory = factory
        self.max_streams = max_streams
        self.slots: list[S | None] = [None] * (max_streams + num_special)
        """Each slot's stream (None until created); read-only outside this class."""
        self._created: list[tuple[int, S]] = []
        """``existing()``, kept in slot order as streams are created (a sync reads it
        on every call: no scan of the empty slots)."""

    def stream_index(self, stream_id: StreamId) -> int:
        """The slot of ``stream_id``."""
        return stream_id.value % self.max_streams

    def get(self, stream_id: StreamId) -> S:
        """The stream for ``stream_id``, created on first use."""
        return self.get_index(stream_id.value % self.max_streams)

    def get_index(self, index: int) -> S:
        """The stream in slot ``index``, created on first use."""
        stream = self.slots[index]
        if stream is None:
            stream = self._factory.create()
            self.slots[index] = stream
            self._created.append((index, stream))
            self._created.sort(key=_slot)
        return stream

    def get_special(self, index: int) -> S:
        """Special slot ``index`` (0 is the GC stream)."""
        return self.get_index(self.max_streams + index)

    def existing(self) -> list[tuple[int, S]]:
        """The streams created so far, with their slot."""
        return list(self._created)


def _slot(entry: tuple[int, object]) -> int:
    return entry[0]
