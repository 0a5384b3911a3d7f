"""CUDA side of array interop: where a tensor's bytes are, and on which stream the work
asynccube queued on them runs (``__cuda_array_interface__`` v3 ``stream``)."""

from __future__ import annotations

from typing import Any

from ..errors import DLPackError
from ..values.stream_id import StreamId
from ..values.types import Binding, Handle
from .driver import check, cu, error_from
from .native.hotpath import hot
from .state import ServerCore

__all__ = ["InteropOps"]


class InteropOps(ServerCore):
    """Export hooks used by :mod:`asynccube._core.client.interop`."""

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
        if consumer != 1 and consumer != 2:  # the default streams are every context's
            self._check_same_device(consumer)
        event = self._events.record(resolved.stream)
        err = hot.stream_wait_event(consumer, event)
        self._events.give(event)  # the wait captured the event's state
        if err:
            raise error_from(err, "cuStreamWaitEvent")
        return ptr

    def _check_same_device(self, consumer: int) -> None:
        """DLPackError unless the stream ``consumer`` belongs to this device's context."""
        context = check(cu().cuStreamGetCtx(cu().CUstream(consumer)), "cuStreamGetCtx")
        if int(context) != int(self._ctx.context):
            raise DLPackError(
                f"__dlpack__(stream={consumer:#x}): that stream belongs to another device "
                f"or context than this tensor's (cuda:{self._ctx.ordinal}); pass a stream "
                "of this device"
            )

    def stream_handle(self, stream: StreamId) -> int:
        """The raw handle of the CUDA stream ``stream`` runs on (what a DLPack
        producer is asked to order its work before)."""
        return int(self._streams.streams.get(stream).stream)

    def import_pointer(
        self, handle: Handle, address: int, nbytes: int, owner: Any, stream: StreamId
    ) -> None:
        """Bind ``handle`` to outside device memory (DLPack import). ``owner`` stands
        where a pool slice would: dropped with the handle once the device has passed
        the last use (the retirer), so the producer's memory is never pooled."""
        handle_id = handle.memory.id
        cursor = self._streams.resolve(stream, ()).cursor
        self._table.bind(handle_id, owner)
        self._addresses[handle_id] = (address, nbytes)
        handle.cursor = cursor
        self._created(handle_id, (stream, cursor))
