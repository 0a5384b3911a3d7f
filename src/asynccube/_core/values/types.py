"""Value types mirroring cubecl-runtime's ``server.rs``.

Handles, bindings and descriptors are small ``__slots__`` classes: they are built on the
launch path, so they avoid dataclass machinery there.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from ..errors import InvalidArgument
from ..html import fmt_bytes as _fmt_bytes
from ..html import memory_usage_html
from .slices import ReleaseQueue, SliceHandle
from .stream_id import StreamId

__all__ = [
    "Allocation",
    "AllocationDescriptor",
    "AllocationKind",
    "Binding",
    "CopyDescriptor",
    "ExecutionMode",
    "Handle",
    "MemoryAllocationMode",
    "MemoryUsage",
    "ProfileDuration",
    "ProfilingToken",
    "TimingMethod",
]


class ExecutionMode(enum.Enum):
    """How much a server checks a launch (cubecl's ``ExecutionMode``)."""

    CHECKED = "checked"
    """Validate launch dimensions and binding sizes before launching."""
    UNCHECKED = "unchecked"
    """Launch as given; out-of-bounds accesses are the kernel's responsibility."""


class AllocationKind(enum.Enum):
    """Layout of a new allocation."""

    CONTIGUOUS = "contiguous"
    """Dense row-major layout, no padding."""
    OPTIMIZED = "optimized"
    """Row-aligned (pitched) where the server supports it; strides say the layout."""


class MemoryAllocationMode(enum.Enum):
    """Which pool new allocations come from (cubecl's ``MemoryAllocationMode``)."""

    AUTO = "auto"
    PERSISTENT = "persistent"


class TimingMethod(enum.Enum):
    """How a profile was timed."""

    FULL = "full"
    """Synchronize at start and end, and measure the wall clock between."""
    DEVICE = "device"
    """Device timestamps (CUDA events) around the profiled work."""


class Handle:
    """A buffer on the server: a slice of memory, optional offsets, and where it was made.

    Attributes:
        memory: The shared slice token; the slice is released when no handle or
            binding refers to it any more.
        offset_start: Bytes skipped at the start of the slice, or ``None``.
        offset_end: Bytes skipped at the end of the slice, or ``None``.
        stream: The stream on which the data was created.
        cursor: The stream position at which the data became available.
        buffer_size: Length of the underlying slice, ignoring offsets.
    """

    __slots__ = ("buffer_size", "cursor", "memory", "offset_end", "offset_start", "stream")

    def __init__(
        self,
        memory: SliceHandle,
        offset_start: int | None,
        offset_end: int | None,
        stream: StreamId,
        cursor: int,
        size: int,
    ) -> None:
        self.memory = memory
        self.offset_start = offset_start
        self.offset_end = offset_end
        self.stream = stream
        self.cursor = cursor
        self.buffer_size = size

    def __repr__(self) -> str:
        return (
            f"Handle(slice={self.memory.id}, size={self.size}, offsets=({self.offset_start}, "
            f"{self.offset_end}), stream={self.stream.value}, cursor={self.cursor})"
        )

    @property
    def size(self) -> int:
        """Size in bytes, accounting for offsets."""
        return self.buffer_size - (self.offset_start or 0) - (self.offset_end or 0)

    def with_offset_start(self, offset: int) -> Handle:
        """A handle over the same slice with ``offset`` more bytes skipped at the start."""
        _check_offset(self, offset)
        start = (self.offset_start or 0) + offset
        return Handle(
            self.memory, start, self.offset_end, self.stream, self.cursor, self.buffer_size
        )

    def with_offset_end(self, offset: int) -> Handle:
        """A handle over the same slice with ``offset`` more bytes dropped at the end."""
        _check_offset(self, offset)
        end = (self.offset_end or 0) + offset
        return Handle(
            self.memory, self.offset_start, end, self.stream, self.cursor, self.buffer_size
        )

    def can_mut(self) -> bool:
        """True if this handle may be reused in place.

        As in cubecl: no other handle or binding refers to the slice, and the calling
        task is on the stream that created it.
        """
        return self._slice_refs() <= _SOLE_REFS and self.stream == StreamId.current()

    def _slice_refs(self) -> int:
        return self.memory.refcount()

    def binding(self) -> Binding:
        """A binding over this handle, for ``execute``, ``read`` and friends."""
        return Binding(
            self.memory,
            self.offset_start,
            self.offset_end,
            self.stream,
            self.cursor,
            self.buffer_size,
        )

    def copy_descriptor(
        self, shape: Sequence[int], strides: Sequence[int], elem_size: int
    ) -> CopyDescriptor:
        """A binding with shape, strides (in elements) and element size, for strided I/O
        (each checked where it is used: ``write``, ``read_tensor``); InvalidArgument
        for a shape or strides that is not a sequence."""
        try:
            dims, steps = tuple(shape), tuple(strides)
        except TypeError:
            raise InvalidArgument(
                f"copy_descriptor: shape and strides must be sequences of ints (one per "
                f"dimension), got {shape!r} and {strides!r}"
            ) from None
        return CopyDescriptor(self.binding(), dims, steps, elem_size)


def _check_offset(handle: Handle, offset: int) -> None:
    if not isinstance(offset, int) or offset < 0 or offset > handle.size:
        raise InvalidArgument(
            f"offset {offset!r} is outside the handle's {handle.size} bytes; "
            "give a non-negative int no larger than handle.size"
        )


class Binding:
    """A handle as it is given to a kernel or a read: the same fields, a shorter life."""

    __slots__ = ("buffer_size", "cursor", "memory", "offset_end", "offset_start", "stream")

    def __init__(
        self,
        memory: SliceHandle,
        offset_start: int | None,
        offset_end: int | None,
        stream: StreamId,
        cursor: int,
        size: int,
    ) -> None:
        self.memory = memory
        self.offset_start = offset_start
        self.offset_end = offset_end
        self.stream = stream
        self.cursor = cursor
        self.buffer_size = size

    def __repr__(self) -> str:
        return (
            f"Binding(slice={self.memory.id}, size={self.size}, stream={self.stream.value}, "
            f"cursor={self.cursor})"
        )

    @property
    def size(self) -> int:
        """Size in bytes, accounting for offsets."""
        return self.buffer_size - (self.offset_start or 0) - (self.offset_end or 0)


class CopyDescriptor:
    """A binding with the shape, strides (in elements) and element size of a tensor."""

    __slots__ = ("binding", "elem_size", "shape", "strides")

    def __init__(
        self,
        binding: Binding,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        elem_size: int,
    ) -> None:
        self.binding = binding
        self.shape = shape
        self.strides = strides
        self.elem_size = elem_size

    def __repr__(self) -> str:
        return (
            f"CopyDescriptor({self.binding!r}, shape={self.shape}, strides={self.strides}, "
            f"elem_size={self.elem_size})"
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the dense tensor described (product of the shape times elem_size)."""
        return math.prod(self.shape) * self.elem_size


@dataclass(frozen=True, slots=True)
class AllocationDescriptor:
    """What to allocate: a layout, a shape and an element size."""

    kind: AllocationKind
    shape: tuple[int, ...]
    elem_size: int

    @classmethod
    def optimized(cls, shape: Sequence[int], elem_size: int) -> AllocationDescriptor:
        """An OPTIMIZED (row-pitched where supported) allocation."""
        return cls(AllocationKind.OPTIMIZED, tuple(shape), elem_size)

    @classmethod
    def contiguous(cls, shape: Sequence[int], elem_size: int) -> AllocationDescriptor:
        """A CONTIGUOUS (dense) allocation."""
        return cls(AllocationKind.CONTIGUOUS, tuple(shape), elem_size)

    @property
    def nbytes(self) -> int:
        """Dense size of the tensor in bytes."""
        return math.prod(self.shape) * self.elem_size


@dataclass(frozen=True, slots=True)
class Allocation:
    """A new buffer and the strides (in elements) of its layout."""

    handle: Handle
    strides: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ProfilingToken:
    """Identifies one profile, so profiles can nest and overlap."""

    id: int


@dataclass(frozen=True, slots=True)
class ProfileDuration:
    """The outcome of a profile: start and end timestamps (ns) and how they were taken."""

    start_ns: int
    end_ns: int
    method: TimingMethod

    @property
    def duration_ns(self) -> int:
        """Elapsed nanoseconds."""
        return self.end_ns - self.start_ns

    @property
    def seconds(self) -> float:
        """Elapsed seconds."""
        return self.duration_ns / 1e9


@dataclass(frozen=True, slots=True)
class MemoryUsage:
    """Memory use of a server, as cubecl reports it."""

    number_allocs: int = 0
    bytes_in_use: int = 0
    bytes_padding: int = 0
    bytes_reserved: int = 0

    def combine(self, other: MemoryUsage) -> MemoryUsage:
        """The sum of two usages (e.g. over pools)."""
        return MemoryUsage(
            self.number_allocs + other.number_allocs,
            self.bytes_in_use + other.bytes_in_use,
            self.bytes_padding + other.bytes_padding,
            self.bytes_reserved + other.bytes_reserved,
        )

    def _repr_html_(self) -> str:
        return memory_usage_html(self)

    def __str__(self) -> str:
        return (
            f"{self.number_allocs} allocations, {_fmt_bytes(self.bytes_in_use)} in use, "
            f"{_fmt_bytes(self.bytes_padding)} padding, "
            f"{_fmt_bytes(self.bytes_reserved)} reserved"
        )


def _sole_refs() -> int:
    probe = Handle(SliceHandle(-1, ReleaseQueue(-1)), None, None, StreamId(0), 0, 0)
    return probe._slice_refs()


_SOLE_REFS: Final = _sole_refs()
