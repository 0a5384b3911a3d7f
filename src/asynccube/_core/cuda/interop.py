"""CUDA side of array interop: where a tensor's bytes are, and on which stream the work
asynccube queued on them runs (``__cuda_array_interface__`` v3 ``stream``)."""

from __future__ import annotations

from ..stream_id import StreamId
from ..types import Binding
from .driver import check, cu
from .state import ServerCore

__all__ = ["InteropOps"]


class InteropOps(ServerCore):
    """Export hooks used by :mod:`asynccube._core.interop`."""

    def export_pointer(self, binding: Binding, stream: StreamId) -> tuple[int, int]:
        """The device address of ``binding`` and the raw handle of the CUDA stream
        after whose queued work it is complete (the calling task's stream, made to wait
        for any other stream that used the buffer; nothing is synchronized)."""
        ptr = self._ptr(binding)  # InvalidHandle for a freed or foreign handle
        resolved = self._streams.resolve(stream, (binding,))
        return ptr, int(resolved.stream)

    def export_to_stream(self, binding: Binding, stream: StreamId, consumer: int | None) -> int:
        """The device address of ``binding``, with the consumer's CUDA stream (a raw
        handle; None: no ordering, the DLPack ``stream=-1``) made to wait, on the
        device, for the work asynccube queued on it: an event recorded on asynccube's
        stream and ``cuStreamWaitEvent``; nothing is synchronized."""
        ptr = self._ptr(binding)
        resolved = self._streams.resolve(stream, (binding,))
        if consumer is None:
            return ptr
        d = cu()
        event = self._events.record(resolved.stream)
        try:
            check(d.cuStreamWaitEvent(d.CUstream(consumer), event, 0), "cuStreamWaitEvent")
        finally:
            self._events.give(event)  # the wait captured the event's state
        return ptr
