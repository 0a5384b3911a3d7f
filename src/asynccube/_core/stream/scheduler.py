"""A stream scheduler that buffers tasks per stream (seed ``stream/scheduler.rs``).

Tasks registered on a stream are kept in that stream's buffer until ``max_tasks`` are
waiting, then executed: handed to the backend stream with ``enqueue`` and submitted with
``flush``. Before a task is registered, every other stream holding one of its bindings is
executed first, so the work that produced a shared binding is submitted before the work
that uses it. Streams executed together follow a :class:`SchedulerStrategy`:

* ``INTERLEAVE``: the other streams are flushed, then the tasks of all streams are
  enqueued round-robin (first task of each stream, then the second, ...) on the first
  stream, which is flushed once.
* ``SEQUENTIAL``: each stream enqueues its own tasks in order and is flushed, one stream
  after the other.

One step beyond the seed (as :class:`~.multi.MultiStream` does): with
``track_last_use`` (the default) the stream a binding belongs to is the stream of the
last task that bound its slice, not only the stream that created it, so a buffer written
by a task on stream A is flushed from A before a task on stream B uses it. Without it,
the seed's rule applies (the creation stream, ``binding.stream``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from ..config.config import LogLevel
from ..config.logging import ServerLogger
from ..errors import InvalidArgument
from ..values.stream_id import StreamId
from ..values.types import Binding
from .pool import StreamFactory, StreamPool

__all__ = [
    "SchedulerMultiStream",
    "SchedulerMultiStreamOptions",
    "SchedulerStrategy",
    "SchedulerStream",
    "SchedulerStreamBackend",
]

T = TypeVar("T")
S = TypeVar("S")
T_contra = TypeVar("T_contra", contravariant=True)


class SchedulerStreamBackend(Protocol[T_contra, S]):
    """What the scheduler needs of a device: enqueue tasks on streams, flush streams."""

    def enqueue(self, task: T_contra, stream: S) -> None:
        """Put ``task`` on ``stream`` (after the tasks enqueued before it)."""
        ...

    def flush(self, stream: S) -> None:
        """Submit the tasks enqueued on ``stream``."""
        ...

    def factory(self) -> StreamFactory[S]:
        """What creates the backend's streams."""
        ...


class SchedulerStrategy(enum.Enum):
    """How streams executed together are laid out on the backend."""

    INTERLEAVE = "interleave"
    """Tasks of all the streams round-robin on the first stream (others flushed first)."""
    SEQUENTIAL = "sequential"
    """Each stream's tasks on its own stream, one stream after the other."""


@dataclass(frozen=True, slots=True)
class SchedulerMultiStreamOptions:
    """Options of a :class:`SchedulerMultiStream`.

    Attributes:
        max_streams: Stream slots (stream index = id mod max_streams).
        max_tasks: Tasks buffered on a stream before it is executed.
        strategy: How streams executed together are laid out.
        track_last_use: Tie a binding to the stream that last used its slice (True), or,
            as in the seed, only to the stream that created it (False).
    """

    max_streams: int
    max_tasks: int
    strategy: SchedulerStrategy = SchedulerStrategy.INTERLEAVE
    track_last_use: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.max_tasks, int) or self.max_tasks < 1:
            raise InvalidArgument(f"max_tasks must be a positive int, got {self.max_tasks!r}")
        if not isinstance(self.strategy, SchedulerStrategy):
            raise InvalidArgument(f"strategy must be a SchedulerStrategy, got {self.strategy!r}")


class SchedulerStream(Generic[T, S]):
    """A backend stream and the tasks buffered for it."""

    __slots__ = ("stream", "tasks")

    def __init__(self, stream: S) -> None:
        self.stream = stream
        self.tasks: list[T] = []

    def __repr__(self) -> str:
        return f"SchedulerStream({self.stream!r}, {len(self.tasks)} tasks)"

    def flush(self) -> list[T]:
        """Take the buffered tasks."""
        tasks, self.tasks = self.tasks, []
        return tasks


class _PoolFactory(Generic[T, S]):
    __slots__ = ("backend",)

    def __init__(self, backend: SchedulerStreamBackend[T, S]) -> None:
        self.backend = backend

    def create(self) -> SchedulerStream[T, S]:
        return SchedulerStream(self.backend.factory().create())


@dataclass(slots=True)
class _Schedule(Generic[T]):
    tasks: list[T]
    stream_index: int


class SchedulerMultiStream(Generic[T, S]):
    """Buffers tasks per stream and executes them in batches (see the module docstring).

    Args:
        backend: Enqueues tasks on, and flushes, the device's streams.
        options: Stream slots, batch size, strategy.
        logger: Where streaming logs go (``asynccube.streaming``; disabled if None).
    """

    def __init__(
        self,
        backend: SchedulerStreamBackend[T, S],
        options: SchedulerMultiStreamOptions,
        logger: ServerLogger | None = None,
    ) -> None:
        self.backend = backend
        self.pool: StreamPool[SchedulerStream[T, S]] = StreamPool(
            _PoolFactory(backend), options.max_streams, 0
        )
        self.max_tasks = options.max_tasks
        self.strategy = options.strategy
        self.track_last_use = options.track_last_use
        self.logger = logger if logger is not None else ServerLogger()
        self.last_use: dict[int, StreamId] = {}

    def stream(self, stream_id: StreamId) -> S:
        """The backend stream of ``stream_id``."""
        return self.pool.get(stream_id).stream

    def register(self, stream_id: StreamId, task: T, bindings: Iterable[Binding]) -> None:
        """Buffer ``task`` on ``stream_id`` after executing the streams it shares
        bindings with; execute the stream once ``max_tasks`` tasks are buffered."""
        bindings = list(bindings)
        self.align_streams(stream_id, bindings)
        if self.track_last_use:
            for binding in bindings:
                self.last_use[binding.memory.id] = stream_id
        current = self.pool.get(stream_id)
        current.tasks.append(task)
        if len(current.tasks) >= self.max_tasks:
            self.execute_streams([stream_id])

    def origin(self, binding: Binding) -> StreamId:
        """The stream ``binding`` belongs to (its slice's last use, else its creator)."""
        if self.track_last_use:
            return self.last_use.get(binding.memory.id, binding.stream)
        return binding.stream

    def forget(self, slice_id: int) -> None:
        """Drop what is known of a released slice."""
        self.last_use.pop(slice_id, None)

    def align_streams(self, stream_id: StreamId, bindings: Iterable[Binding]) -> None:
        """Execute every other stream that holds one of ``bindings``."""
        to_flush: list[StreamId] = []
        index = self.pool.stream_index(stream_id)
        logger = self.logger
        full = logger.streaming >= LogLevel.FULL
        for binding in bindings:
            origin = self.origin(binding)
            if self.pool.stream_index(origin) != index:
                to_flush.append(origin)
                if full:
                    logger.log_streaming(
                        LogLevel.FULL, f"Binding on {origin} is shared on {stream_id}"
                    )
        if not to_flush:
            return
        if logger.streaming:
            logger.log_streaming(
                LogLevel.BASIC,
                lambda: (
                    f"Flushing streams {[str(s) for s in to_flush]} before registering more "
                    f"tasks on {stream_id}"
                ),
            )
        self.execute_streams(to_flush)

    def execute_streams(self, stream_ids: Iterable[StreamId]) -> None:
        """Execute the buffered tasks of each stream (each slot once), per the strategy."""
        indices: list[int] = []
        for stream_id in stream_ids:
            index = self.pool.stream_index(stream_id)
            if index not in indices:
                indices.append(index)
        schedules = [_Schedule(self.pool.get_index(i).flush(), i) for i in indices]
        if not schedules:
            return
        if self.strategy is SchedulerStrategy.INTERLEAVE:
            self._execute_interleave(schedules)
        else:
            self._execute_sequential(schedules)

    def _execute_sequential(self, schedules: list[_Schedule[T]]) -> None:
        backend = self.backend
        for schedule in schedules:
            stream = self.pool.get_index(schedule.stream_index).stream
            for task in schedule.tasks:
                backend.enqueue(task, stream)
            backend.flush(stream)

    def _execute_interleave(self, schedules: list[_Schedule[T]]) -> None:
        backend = self.backend
        for schedule in schedules[1:]:
            backend.flush(self.pool.get_index(schedule.stream_index).stream)
        stream = self.pool.get_index(schedules[0].stream_index).stream
        longest = max(len(s.tasks) for s in schedules)
        for position in range(longest):
            for schedule in schedules:
                if position < len(schedule.tasks):
                    backend.enqueue(schedule.tasks[position], stream)
        backend.flush(stream)
