"""Multi-stream execution with event/cursor synchronization (seed ``stream_event.rs``).

Each stream keeps a cursor (how many operations were resolved on it) and, for every other
stream, the cursor it last synchronized with. Resolving an operation on stream S over some
bindings finds the bindings whose data comes from another stream at a cursor S has not yet
synchronized with, flushes each such origin stream to an event, makes S wait on it, and
advances S's cursor.

One step beyond the seed (as cubecl does when it stamps a slice at bind time): the origin
of a binding is the stream and cursor of the *last use* of its slice (every execute, read
and write that binds it), not only where the slice was created. So a buffer written in
place by a kernel on task A's stream and then bound on task B's stream is seen complete.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from ..config.config import LogLevel
from ..config.logging import ServerLogger
from ..values.stream_id import StreamId
from ..values.types import Binding
from .pool import StreamPool

__all__ = [
    "EventStreamBackend",
    "MultiStream",
    "ResolvedStreams",
    "SharedBindingAnalysis",
    "StreamWrapper",
]

St = TypeVar("St")
Ev = TypeVar("Ev")


class EventStreamBackend(Protocol[St, Ev]):
    """Stream and event operations of a device (host workers, CUDA streams)."""

    def create_stream(self) -> St:
        """A new stream."""
        ...

    def flush(self, stream: St) -> Ev:
        """Submit the stream's pending work; return an event reached when it is done."""
        ...

    def wait_event(self, stream: St, event: Ev) -> None:
        """Make ``stream`` wait for ``event`` before its later work (no host block)."""
        ...

    def wait_event_sync(self, event: Ev) -> None:
        """Block the calling thread until ``event`` is reached (never on the loop)."""
        ...


class StreamWrapper(Generic[St]):
    """A backend stream with its cursor and the cursors it last synchronized with."""

    __slots__ = ("cursor", "done", "last_synced", "stream")

    def __init__(self, stream: St) -> None:
        self.stream = stream
        self.cursor = 0
        self.last_synced: dict[int, int] = {}
        self.done = -1
        """The cursor up to which the stream's work is known complete (-1: none)."""

    def __repr__(self) -> str:
        return f"StreamWrapper(cursor={self.cursor}, last_synced={self.last_synced})"


@dataclass(slots=True)
class SharedBindingAnalysis:
    """Slices shared from other streams, grouped by origin stream index."""

    slices: dict[int, list[int]] = field(default_factory=dict)

    def shared(self, slice_id: int, index: int) -> None:
        """Record that ``slice_id`` comes from the stream at ``index``."""
        self.slices.setdefault(index, []).append(slice_id)


class _Factory(Generic[St, Ev]):
    __slots__ = ("backend",)

    def __init__(self, backend: EventStreamBackend[St, Ev]) -> None:
        self.backend = backend

    def create(self) -> StreamWrapper[St]:
        return StreamWrapper(self.backend.create_stream())


class ResolvedStreams(Generic[St]):
    """The outcome of :meth:`MultiStream.resolve` (built on every launch: kept light).

    Attributes:
        cursor: The cursor of this operation on the current stream (new allocations
            made by it become available at this cursor).
        current: The id of the stream the operation runs on.
        stream: The backend stream to enqueue the operation on.
        analysis: The shared bindings found (None when nothing was shared).
    """

    __slots__ = ("analysis", "current", "cursor", "stream")

    def __init__(
        self,
        cursor: int,
        current: StreamId,
        stream: St,
        analysis: SharedBindingAnalysis | None,
    ) -> None:
        self.cursor = cursor
        self.current = current
        self.stream = stream
        self.analysis = analysis


class MultiStream(Generic[St, Ev]):
    """Streams created on demand, kept in order with each other by events.

    Args:
        backend: The device's stream/event operations.
        max_streams: Number of stream slots (stream index = id mod max_streams).
        logger: Where streaming logs go.
    """

    def __init__(
        self, backend: EventStreamBackend[St, Ev], max_streams: int, logger: ServerLogger
    ) -> None:
        self.backend = backend
        self.streams: StreamPool[StreamWrapper[St]] = StreamPool(_Factory(backend), max_streams, 1)
        self.max_streams = max_streams
        self.logger = logger
        self.last_use: dict[int, tuple[StreamId, int]] = {}
        self.record_wait: Callable[[St, Ev, StreamId, int], None] | None = None
        """When set (profiling), makes a stream wait for an event instead of
        ``backend.wait_event``, recording the wait: (stream, event, waiting id, origin)."""

    def stream_index(self, stream_id: StreamId) -> int:
        """The slot of ``stream_id``."""
        return stream_id.value % self.max_streams

    def resolve(self, stream_id: StreamId, bindings: Iterable[Binding]) -> ResolvedStreams[St]:
        """Align ``stream_id`` with the origins of ``bindings``; advance its cursor.

        Every binding's slice is then stamped as last used by this stream at the new
        cursor.
        """
        if not isinstance(bindings, list):
            bindings = list(bindings)
        max_streams = self.max_streams
        own = stream_id.value % max_streams
        last_use = self.last_use
        analysis = None
        for binding in bindings:  # fast path: every origin is on this stream's slot
            origin = last_use.get(binding.memory.id)
            if (binding.stream if origin is None else origin[0]).value % max_streams != own:
                analysis = self._shared(stream_id, bindings)
                if analysis is not None:
                    self.apply_analysis(stream_id, analysis)
                break
        current = self.streams.slots[own] or self.streams.get_index(own)
        cursor = current.cursor = current.cursor + 1
        if bindings:
            stamp = (stream_id, cursor)
            for binding in bindings:
                last_use[binding.memory.id] = stamp
        return ResolvedStreams(cursor, stream_id, current.stream, analysis)

    def advance(self, stream_id: StreamId) -> int:
        """``resolve(stream_id, ()).cursor`` without building the result: advance the
        stream's cursor (an operation with no bindings, e.g. an allocation)."""
        own = stream_id.value % self.max_streams
        current = self.streams.slots[own] or self.streams.get_index(own)
        cursor = current.cursor = current.cursor + 1
        return cursor

    def origin(self, binding: Binding) -> tuple[StreamId, int]:
        """Where the data of ``binding`` comes from: the last use of its slice."""
        return self.last_use.get(binding.memory.id, (binding.stream, binding.cursor))

    def update_shared_bindings(
        self, stream_id: StreamId, bindings: Iterable[Binding]
    ) -> SharedBindingAnalysis:
        """Find bindings whose origin stream is not yet synced with ``stream_id``."""
        return self._shared(stream_id, bindings) or SharedBindingAnalysis()

    def _shared(
        self, stream_id: StreamId, bindings: Iterable[Binding]
    ) -> SharedBindingAnalysis | None:
        analysis: SharedBindingAnalysis | None = None
        max_streams = self.max_streams
        own_index = stream_id.value % max_streams
        last_use = self.last_use.get
        last_synced: dict[int, int] | None = None
        for binding in bindings:
            # Inlined origin(): this loop is on every launch's path.
            origin, cursor = last_use(binding.memory.id) or (binding.stream, binding.cursor)
            index = origin.value % max_streams
            if index == own_index:  # the same stream, or one sharing its slot
                continue
            if last_synced is None:
                last_synced = self.streams.get_index(own_index).last_synced
            last = last_synced.get(index)
            if last is None or last < cursor:
                self._log_shared(binding, origin, stream_id, last, cursor)
                if analysis is None:
                    analysis = SharedBindingAnalysis()
                analysis.shared(binding.memory.id, index)
        return analysis

    def _log_shared(
        self, binding: Binding, origin: StreamId, stream_id: StreamId, last: int | None, cursor: int
    ) -> None:
        if self.logger.streaming >= LogLevel.FULL:
            why = "it was never synced" if last is None else f"it's not synced {last} < {cursor}"
            self.logger.log_streaming(
                LogLevel.FULL,
                lambda: f"Binding {binding!r} on {origin} is shared on {stream_id} since {why}",
            )

    def apply_analysis(self, stream_id: StreamId, analysis: SharedBindingAnalysis) -> None:
        """Flush each origin stream to an event and make ``stream_id`` wait on it."""
        if not analysis.slices:
            return
        events = []
        for origin in analysis.slices:
            wrapper = self.streams.get_index(origin)
            events.append((origin, wrapper.cursor, self.backend.flush(wrapper.stream)))
        current = self.streams.get(stream_id)
        for origin, cursor, event in events:
            current.last_synced[origin] = cursor
            if self.logger.streaming:
                self.logger.log_streaming(LogLevel.BASIC, f"Waiting on {origin} from {stream_id}")
            if self.record_wait is not None:
                self.record_wait(current.stream, event, stream_id, origin)
            else:
                self.backend.wait_event(current.stream, event)

    def gc_stream(self) -> St:
        """The special GC stream."""
        return self.streams.get_special(0).stream

    def flush_all(self) -> list[Ev]:
        """Flush every stream created so far; return their events."""
        return [self.backend.flush(w.stream) for _, w in self.streams.existing()]

    def flush_pending(self) -> tuple[list[Ev], list[tuple[StreamWrapper[St], int]]]:
        """Flush each stream with work not yet known complete (its cursor moved since
        a :meth:`mark_done`); return their events and the marks to pass to
        :meth:`mark_done` once those events completed without error."""
        marks = [(w, w.cursor) for _, w in self.streams.existing() if w.cursor != w.done]
        return [self.backend.flush(w.stream) for w, _ in marks], marks

    @staticmethod
    def mark_done(marks: list[tuple[StreamWrapper[St], int]]) -> None:
        """Record that each stream's work up to its mark has completed."""
        for wrapper, cursor in marks:
            if wrapper.done < cursor:
                wrapper.done = cursor

    def existing_streams(self) -> list[St]:
        """Every backend stream created so far (GC stream included)."""
        return [w.stream for _, w in self.streams.existing()]
