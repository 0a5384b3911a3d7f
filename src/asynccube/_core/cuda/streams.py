"""Streams and events of the CUDA server: MultiStream's backend on CUDA streams, and
the :class:`Retirer` that keeps objects (dropped slices, staging buffers) alive until the
device has passed their last use, by events polled once per actor batch.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from .completion import EventPool
from .driver import check, cu, error_from
from .native.hotpath import hot

__all__ = ["CudaBackend", "Retirer"]


class CudaBackend:
    """MultiStream's ``EventStreamBackend`` on CUDA streams and events."""

    def __init__(self, events: EventPool, priority: int) -> None:
        self.events = events
        self.priority = priority
        self.created: list[Any] = []

    def create_stream(self) -> Any:
        """A non-blocking stream with the configured priority."""
        d = cu()
        flags = int(d.CUstream_flags.CU_STREAM_NON_BLOCKING)
        res = d.cuStreamCreateWithPriority(flags, self.priority)
        stream = check(res, "cuStreamCreateWithPriority")
        self.created.append(stream)
        return stream

    def flush(self, stream: Any) -> Any:
        """An event recorded after the stream's work so far."""
        return self.events.record(stream)

    def wait_event(self, stream: Any, event: Any) -> None:
        """Make ``stream`` wait for ``event``; the event is free again at once (the
        wait captured its state)."""
        err = hot.stream_wait_event(stream, event)
        if err:
            raise error_from(err, "cuStreamWaitEvent")
        self.events.give(event)

    def wait_event_sync(self, event: Any) -> None:
        """Block the calling (helper) thread until ``event``."""
        check(cu().cuEventSynchronize(event), "cuEventSynchronize")


class Retirer:
    """Keeps objects alive until the device has passed where they were last used.

    ``hold(stream, obj)`` parks ``obj``; ``seal()`` (once per actor batch) records one
    event per stream with parked objects; ``poll()`` drops the objects of every event
    already reached. Nothing blocks.
    """

    def __init__(self, events: EventPool) -> None:
        self._events = events
        self._parked: dict[int, tuple[Any, list[object]]] = {}
        self._inflight: dict[int, deque[tuple[Any, list[object]]]] = {}

    def hold(self, stream: Any, obj: object) -> None:
        """Keep ``obj`` until the device passes the work queued on ``stream`` so far."""
        key = int(stream)
        slot = self._parked.get(key)
        if slot is None:
            self._parked[key] = (stream, [obj])
        else:
            slot[1].append(obj)

    def seal(self) -> None:
        """Record an event after the parked objects of each stream."""
        if not self._parked:
            return
        for key, (stream, objs) in self._parked.items():
            event = self._events.record(stream)
            self._inflight.setdefault(key, deque()).append((event, objs))
        self._parked.clear()

    def poll(self) -> int:
        """Drop what the device has passed; return how many groups are still held.
        (Only streams with groups in flight are visited: it runs for every copy.)"""
        inflight = self._inflight
        if not inflight:
            return 0
        query = hot.event_query
        left = 0
        passed = []
        for key, queue in inflight.items():
            while queue:
                event, objs = queue[0]
                if query(event):
                    break
                queue.popleft()
                objs.clear()
                self._events.give(event)
            if queue:
                left += len(queue)
            else:
                passed.append(key)
        for key in passed:
            del inflight[key]
        return left

    def clear(self) -> None:
        """Drop everything (after the device is idle, or dead)."""
        self._parked.clear()
        self._inflight.clear()
