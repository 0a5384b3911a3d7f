"""The memory half of a client's commands (the base of :class:`~.client_core.ClientCore`):
tensors allocated with their layouts, handles minted after the size checks, the memory
commands (usage, cleanup, allocation mode), and the plumbing that sends a command to
the channel with the calling task's stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from ..channel.channel import Channel
from ..errors import BufferTooBig, InvalidArgument
from ..html import fmt_bytes
from ..server.protocol import ComputeServer, DeviceProperties
from ..values.stream_id import StreamId
from ..values.types import (
    AllocationDescriptor,
    AllocationKind,
    CopyDescriptor,
    Handle,
    MemoryAllocationMode,
    MemoryUsage,
)
from .args import DataLike, _is_int, _same_length, as_bytes

__all__ = ["MemoryOps"]


class MemoryOps:
    """Allocation of tensors, handle minting, memory commands and the send plumbing of
    a client (see above); :class:`~.client_core.ClientCore` holds the channel and the
    server and writes the data."""

    _channel: Channel
    _server: ComputeServer

    def write(self, items: Sequence[tuple[CopyDescriptor, DataLike]], *extra: object) -> None:
        """Write dense data into each tensor (the client's)."""
        raise NotImplementedError

    # -- tensors ------------------------------------------------------------------------

    def create_tensors(
        self,
        data: Sequence[DataLike],
        shapes: Sequence[Sequence[int]],
        elem_sizes: Sequence[int],
        kind: AllocationKind = AllocationKind.OPTIMIZED,
    ) -> list[tuple[Handle, tuple[int, ...]]]:
        """New tensors holding ``data`` (dense, row-major); returns (handle, strides)."""
        self._channel.check()
        _same_length(data=data, shapes=shapes, elem_sizes=elem_sizes)
        out = self._new_tensors(shapes, elem_sizes, kind)
        items = []
        for (handle, strides), raw, shape, elem in zip(out, data, shapes, elem_sizes, strict=True):
            items.append((handle.copy_descriptor(shape, strides, elem), as_bytes(raw)))
        self.write(items)
        return out

    def empty_tensors(
        self,
        shapes: Sequence[Sequence[int]],
        elem_sizes: Sequence[int],
        kind: AllocationKind = AllocationKind.OPTIMIZED,
    ) -> list[tuple[Handle, tuple[int, ...]]]:
        """New uninitialized tensors; OPTIMIZED ones have pitched rows. Returns
        (handle, strides in elements) for each."""
        self._channel.check()
        _same_length(shapes=shapes, elem_sizes=elem_sizes)
        return self._new_tensors(shapes, elem_sizes, kind)

    def _new_tensors(
        self,
        shapes: Sequence[Sequence[int]],
        elem_sizes: Sequence[int],
        kind: AllocationKind,
    ) -> list[tuple[Handle, tuple[int, ...]]]:
        descs = [
            AllocationDescriptor(kind, tuple(int(d) for d in s), int(e))
            for s, e in zip(shapes, elem_sizes, strict=True)
        ]
        layouts = [self._server.layout(d) for d in descs]
        handles = [self._mint(size) for size, _ in layouts]
        self._send_fire(self._server.create, handles)
        return [(h, strides) for h, (_, strides) in zip(handles, layouts, strict=True)]

    def _mint(self, size: int, stream: StreamId | None = None) -> Handle:
        if not _is_int(size):
            raise InvalidArgument(
                f"size={size!r} must be an int (a size in bytes), got {type(size).__name__}"
            )
        size = int(size)  # numpy integers are ordinary ints
        limit = self._server.properties.max_allocation
        if size < 0:
            raise InvalidArgument(f"size={size} must be >= 0 (a size in bytes)")
        if size > limit:
            raise BufferTooBig(size, _too_big(self._server.properties, limit))
        return self._server.new_handle(size, stream if stream is not None else StreamId.current())

    # -- memory -------------------------------------------------------------------------

    def memory_usage(self) -> asyncio.Future[MemoryUsage]:
        """Current memory usage (awaitable)."""
        self._channel.check()
        channel = self._channel
        return channel.request(channel.call, StreamId.current(), self._server.memory_usage)

    def memory_cleanup(self) -> None:
        """Release memory nothing uses."""
        self._channel.check()
        self._send_fire(self._server.memory_cleanup)

    def allocation_mode(self, mode: MemoryAllocationMode) -> None:
        """Switch which pools new allocations come from (AUTO or PERSISTENT)."""
        self._channel.check()
        if not isinstance(mode, MemoryAllocationMode):
            raise InvalidArgument(f"mode must be a MemoryAllocationMode, got {mode!r}")
        self._send_fire(self._server.allocation_mode, mode)

    # -- plumbing -----------------------------------------------------------------------

    def _send_fire(self, fn: Callable[..., Any], *args: Any) -> None:
        channel = self._channel
        channel.send(channel.fire, StreamId.current(), fn, *args)

    def _request(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        channel = self._channel
        return channel.request(channel.await_completion, StreamId.current(), fn, *args)


def _too_big(properties: DeviceProperties, limit: int) -> str:
    """Why a size above ``limit`` is refused, and what to do."""
    where = f"the largest allocation on {properties.name} is {limit} bytes ({fmt_bytes(limit)})"
    if properties.kind == "host":
        where += (
            ": the machine's physical memory, unless [memory] host_limit_bytes "
            "(ASYNCCUBE_MEMORY_HOST_LIMIT_BYTES) sets another limit"
        )
    return f"{where}; allocate less, or split the data into several buffers"
