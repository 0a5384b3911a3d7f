"""The memory part of a client: handles minted after the size checks, tensors allocated
with their layouts (filled through the data-movement part), and the memory commands
(usage, report, cleanup, allocation mode)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..channel.channel import Channel
from ..config.pools import MemoryLayout
from ..errors import BufferTooBig, InvalidArgument
from ..html import fmt_bytes
from ..memory.management import MemoryReport
from ..server.protocol import ComputeServer, DeviceProperties
from ..values.stream_id import StreamId
from ..values.types import (
    AllocationDescriptor,
    AllocationKind,
    Handle,
    MemoryAllocationMode,
    MemoryUsage,
)
from .args import DataLike, _is_int, _same_length, as_bytes
from .dispatch import Dispatch
from .movement import DataMovement

__all__ = ["ClientMemory"]


class ClientMemory:
    """Allocation and memory commands of one client (see above). A method that checks
    the channel has the name of the client's method it serves: a graph capture's guard
    names the command after its caller."""

    __slots__ = ("_channel", "_dispatch", "_movement", "_server", "scratch")

    def __init__(
        self,
        server: ComputeServer,
        channel: Channel,
        dispatch: Dispatch,
        movement: DataMovement,
    ) -> None:
        self._server = server
        self._channel = channel
        self._dispatch = dispatch
        self._movement = movement
        self.scratch: dict[Any, Any] = {}
        """Buffers library code keeps on this client for reuse (a called reduction's
        partials, by stream: :mod:`..kernels.reduction`); ``memory_cleanup()`` drops
        them, so that what they hold goes back with the rest."""

    @property
    def server(self) -> ComputeServer:
        """The client's server."""
        return self._server

    # -- handles and tensors ------------------------------------------------------------

    def mint(self, size: int, stream: StreamId | None = None) -> Handle:
        """A new handle of ``size`` bytes (nothing allocated yet), after the size checks."""
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

    def create_tensors(
        self,
        data: Sequence[DataLike],
        shapes: Sequence[Sequence[int]],
        elem_sizes: Sequence[int],
        kind: AllocationKind,
    ) -> list[tuple[Handle, tuple[int, ...]]]:
        """See :meth:`ComputeClient.create_tensors`."""
        self._channel.check()
        _same_length(data=data, shapes=shapes, elem_sizes=elem_sizes)
        out = self._new_tensors(shapes, elem_sizes, kind)
        items = []
        for (handle, strides), raw, shape, elem in zip(out, data, shapes, elem_sizes, strict=True):
            items.append((handle.copy_descriptor(shape, strides, elem), as_bytes(raw)))
        self._movement.write(items)
        return out

    def empty_tensors(
        self,
        shapes: Sequence[Sequence[int]],
        elem_sizes: Sequence[int],
        kind: AllocationKind,
    ) -> list[tuple[Handle, tuple[int, ...]]]:
        """See :meth:`ComputeClient.empty_tensors`."""
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
        handles = [self.mint(size) for size, _ in layouts]
        self._dispatch.fire(self._server.create, handles)
        return [(h, strides) for h, (_, strides) in zip(handles, layouts, strict=True)]

    # -- memory commands ----------------------------------------------------------------

    def memory_usage(self) -> asyncio.Future[MemoryUsage]:
        """See :meth:`ComputeClient.memory_usage`."""
        self._channel.check()
        channel = self._channel
        return channel.request(channel.call, StreamId.current(), self._server.memory_usage)

    def memory_report(self) -> asyncio.Future[MemoryReport]:
        """See :meth:`ComputeClient.memory_report`."""
        self._channel.check()
        channel = self._channel
        return channel.request(channel.call, StreamId.current(), self._server.memory_report)

    def memory_cleanup(self) -> None:
        """See :meth:`ComputeClient.memory_cleanup`."""
        self._channel.check()
        self.scratch.clear()  # their handles released first, then the cleanup runs
        self._dispatch.fire(self._server.memory_cleanup)

    async def set_memory_layout(
        self, layout: MemoryLayout, sync: Callable[[], Awaitable[None]]
    ) -> None:
        """See :meth:`ComputeClient.set_memory_layout` (``sync``: the client's)."""
        self._channel.check()
        if not isinstance(layout, MemoryLayout):
            raise InvalidArgument(
                f"layout must be a MemoryLayout (ac.MemoryLayout([ac.MemoryPool(...), ...])), "
                f"got {layout!r}"
            )
        await sync()  # the work queued so far finishes (and drops its buffers) first
        channel = self._channel
        server = self._server
        await channel.request(channel.call, StreamId.current(), server.set_memory_layout, layout)

    def allocation_mode(self, mode: MemoryAllocationMode) -> None:
        """See :meth:`ComputeClient.allocation_mode`."""
        self._channel.check()
        if not isinstance(mode, MemoryAllocationMode):
            raise InvalidArgument(f"mode must be a MemoryAllocationMode, got {mode!r}")
        self._dispatch.fire(self._server.allocation_mode, mode)


def _too_big(properties: DeviceProperties, limit: int) -> str:
    """Why a size above ``limit`` is refused, and what to do."""
    where = f"the largest allocation on {properties.name} is {limit} bytes ({fmt_bytes(limit)})"
    if properties.kind == "host":
        where += (
            ": the machine's physical memory, unless [memory] host_limit_bytes "
            "(ASYNCCUBE_MEMORY_HOST_LIMIT_BYTES) sets another limit"
        )
    return f"{where}; allocate less, or split the data into several buffers"
