"""What every server shares: minting handles and binding them to memory slices."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Generic, TypeVar

from ..memory.table import SliceTable
from ..stream.multi import MultiStream
from ..values.stream_id import StreamId
from ..values.types import Allocation, AllocationDescriptor, Binding, CopyDescriptor, Handle
from .layout import allocation_layout
from .protocol import BytesLike

__all__ = ["SliceServer"]

M = TypeVar("M")


class SliceServer(Generic[M]):
    """Base of the host and CUDA servers: ``layout``, ``new_handle``, ``create`` and
    ``create_with_data``, over a :class:`SliceTable` of ``M`` (what a handle is bound
    to) and a :class:`MultiStream`.

    Subclasses set ``row_align`` and ``_table``/``_streams``, and implement
    ``_allocate``, ``_release_dropped`` and ``write``.
    """

    row_align: ClassVar[int]
    """OPTIMIZED rows are padded to a multiple of this many bytes."""
    _table: SliceTable[M]
    _streams: MultiStream[Any, Any]

    def layout(self, descriptor: AllocationDescriptor) -> tuple[int, tuple[int, ...]]:
        """Bytes and strides of ``descriptor`` (OPTIMIZED rows padded to ``row_align``)."""
        return allocation_layout(descriptor, self.row_align)

    def new_handle(self, size: int, stream: StreamId) -> Handle:
        """Mint a handle; memory is bound by ``create``."""
        return self._table.new_handle(size, stream)

    def handle_watermark(self) -> int:
        """An id above that of every handle minted so far: those minted later have
        greater ids (a warm-up scope tells the buffers made during it from older ones
        this way; it uses up one id)."""
        return next(self._table._ids)

    def stream_slot(self, stream: StreamId) -> int:
        """The slot of the stream pool that ``stream`` runs on."""
        return self._streams.stream_index(stream)

    def owns(self, binding: Binding | Handle) -> bool:
        """True if ``binding`` was minted by this server (any thread)."""
        return binding.memory.queue is self._table.queue

    @property
    def handle_owner(self) -> object:
        """The token every handle minted here carries (``handle.memory.queue``): a
        handle is this server's exactly when it carries this one (the client's O(1)
        check at the call, without a call per binding)."""
        return self._table.queue

    def check_binding(self, binding: Binding) -> None:
        """Raise InvalidHandle unless ``binding`` has memory on this server."""
        self._table.get(binding)

    def fail_handle(self, handle: Handle, error: BaseException) -> None:
        """Make ``handle`` invalid: its uses raise InvalidHandle naming ``error``."""
        self._table.fail(handle.memory.id, error)

    def create(self, handles: Sequence[Handle], stream: StreamId) -> None:
        """Reserve memory for each minted handle (a failure leaves it invalid, naming
        the cause, and is raised)."""
        self._release_dropped()
        cursor = self._streams.advance(stream)
        for handle in handles:
            self._reserve(handle, stream, cursor)

    def allocate(
        self, descriptors: Sequence[AllocationDescriptor], stream: StreamId
    ) -> list[Allocation]:
        """cubecl's ``create``: reserve memory for each descriptor and return the handles
        with their strides (for driving a server directly; the client mints handles
        itself and calls ``create``)."""
        layouts = [self.layout(d) for d in descriptors]
        handles = [self.new_handle(size, stream) for size, _ in layouts]
        self.create(handles, stream)
        return [Allocation(h, strides) for h, (_, strides) in zip(handles, layouts, strict=True)]

    def create_with_data(self, handle: Handle, data: BytesLike, stream: StreamId) -> None:
        """Reserve ``handle`` and copy ``data`` into it."""
        self.create([handle], stream)
        size = handle.buffer_size
        self.write([(handle.copy_descriptor((size,), (1,), 1), data)], stream)

    def _reserve(self, handle: Handle, stream: StreamId, cursor: int) -> None:
        handle_id = handle.memory.id
        try:
            memory = self._allocate(handle.buffer_size)
        except BaseException as exc:
            self._table.fail(handle_id, exc)
            raise
        self._table.bind(handle_id, memory)
        handle.cursor = cursor
        self._created(handle_id, (stream, cursor))

    def _created(self, handle_id: int, stamp: tuple[StreamId, int]) -> None:
        """Record where a handle's memory became available (its first use)."""
        self._streams.last_use[handle_id] = stamp

    @abstractmethod
    def _allocate(self, size: int) -> M:
        """Memory for a handle of ``size`` bytes."""

    @abstractmethod
    def _release_dropped(self) -> None:
        """Take back the memory of handles dropped since the last call."""

    @abstractmethod
    def write(self, items: Sequence[tuple[CopyDescriptor, BytesLike]], stream: StreamId) -> None:
        """Copy dense bytes into each tensor, in stream order."""
