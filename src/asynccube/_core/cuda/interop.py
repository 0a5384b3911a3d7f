"""CUDA side of array interop: where a tensor's bytes are, and on which stream the work
asynccube queued on them runs (``__cuda_array_interface__`` v3 ``stream``)."""

from __future__ import annotations

from ..stream_id import StreamId
from ..types import Binding
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
