"""Value types mirroring cubecl-runtime's ``server.rs``.

Handles, bindings and descriptors are small ``__slots__`` classes: they are built on the
launch path, so they avoid dataclass machinery there.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from .errors import InvalidArgument, ScalarTypeError
from .slices import ReleaseQueue, SliceHandle
from .stream_id import StreamId

__all__ = [
    "Allocation",
    "AllocationDescriptor",
    "AllocationKind",
    "Binding",
    "Bindings",
    "CopyDescriptor",
    "CubeCount",
    "ExecutionMode",
    "Handle",
    "Im2colFormat",
    "MemoryAllocationMode",
    "MemoryUsage",
    "MetadataBinding",
    "OobFill",
    "ProfileDuration",
    "ProfilingToken",
    "SCALAR_DTYPES",
    "ScalarBinding",
    "TensorMapBinding",
    "TensorMapInterleave",
    "TensorMapMeta",
    "TensorMapPrefetch",
    "TensorMapSwizzle",
    "TiledFormat",
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
        """A binding with shape, strides (in elements) and element size, for strided I/O."""
        return CopyDescriptor(self.binding(), tuple(shape), tuple(strides), elem_size)


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


SCALAR_DTYPES: Final[tuple[np.dtype[np.generic], ...]] = tuple(
    np.dtype(t)
    for t in (
        "float64",
        "float32",
        "float16",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint64",
        "uint32",
        "uint16",
        "uint8",
    )
)
"""Scalar dtypes a kernel can take, in ABI order (see the README's kernel ABI)."""

_SCALAR_ORDER: Final = {dt: i for i, dt in enumerate(SCALAR_DTYPES)}


def scalar_dtype(ty: npt.DTypeLike) -> np.dtype[np.generic]:
    """Normalize ``ty`` to a supported scalar dtype or raise ScalarTypeError."""
    try:
        dt = np.dtype(ty)
    except TypeError as exc:
        raise ScalarTypeError(f"{ty!r} is not a numpy dtype") from exc
    if dt.newbyteorder("=") not in _SCALAR_ORDER:
        names = ", ".join(d.name for d in SCALAR_DTYPES)
        raise ScalarTypeError(f"scalar dtype {dt} is not supported; use one of {names}")
    return dt.newbyteorder("=")


class ScalarBinding:
    """Scalars of one dtype for a launch.

    Attributes:
        ty: The numpy dtype of the scalars.
        length: How many scalars there are.
        data: The scalars' bytes, zero-padded to a multiple of 8.
    """

    __slots__ = ("_values", "data", "length", "ty")

    def __init__(self, ty: npt.DTypeLike, values: npt.ArrayLike) -> None:
        dt = scalar_dtype(ty)
        arr = _scalar_array(dt, values)
        self.ty = dt
        self.length = int(arr.size)
        raw = arr.tobytes()
        self.data = raw + b"\0" * (-len(raw) % 8)
        self._values = np.frombuffer(self.data, dtype=dt, count=self.length)

    def __repr__(self) -> str:
        return f"ScalarBinding({self.ty}, {self.values().tolist()})"

    def values(self) -> npt.NDArray[np.generic]:
        """The scalars as a numpy array of ``ty`` (a read-only view of ``data``)."""
        return self._values


def _scalar_array(dt: np.dtype[np.generic], values: npt.ArrayLike) -> npt.NDArray[np.generic]:
    if isinstance(values, np.ndarray | np.generic):
        if values.dtype != dt:
            raise ScalarTypeError(
                f"scalars declared {dt} but given an array of {values.dtype}; "
                f"cast with .astype(np.{dt.name}) or declare {values.dtype}"
            )
        return np.ascontiguousarray(values, dtype=dt).reshape(-1)
    items = list(values) if isinstance(values, Iterable) else [values]
    return np.array([_checked_scalar(dt, v) for v in items], dtype=dt)


def _checked_scalar(dt: np.dtype[np.generic], value: object) -> object:
    if isinstance(value, np.generic):
        if value.dtype != dt:
            raise ScalarTypeError(
                f"scalar {value!r} is a {value.dtype}, not a {dt}; convert it or declare "
                f"{value.dtype}"
            )
        return value
    kind = dt.kind
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScalarTypeError(f"scalar {value!r} is not a number for dtype {dt}")
    if kind in "iu":
        if not isinstance(value, int) and not float(value).is_integer():
            raise ScalarTypeError(f"scalar {value!r} is not an integer for dtype {dt}")
        info = np.iinfo(dt.str)
        if not info.min <= int(value) <= info.max:
            raise ScalarTypeError(f"scalar {value!r} does not fit in {dt}")
        return int(value)
    return value


class MetadataBinding:
    """Packed ``uint32`` metadata of a launch (shapes, strides, lengths)."""

    __slots__ = ("data", "static_len")

    def __init__(self, data: npt.ArrayLike = (), static_len: int = 0) -> None:
        arr = np.asarray(data, dtype=np.uint32).reshape(-1)
        self.data: npt.NDArray[np.uint32] = arr
        self.static_len = static_len

    def __repr__(self) -> str:
        return f"MetadataBinding({self.data.tolist()}, static_len={self.static_len})"

    def __len__(self) -> int:
        return int(self.data.size)


class TensorMapInterleave(enum.Enum):
    """TMA interleave layout."""

    NONE = 0
    B16 = 1
    B32 = 2


class TensorMapSwizzle(enum.Enum):
    """TMA shared-memory swizzle."""

    NONE = 0
    B32 = 1
    B64 = 2
    B128 = 3


class TensorMapPrefetch(enum.Enum):
    """TMA L2 promotion (prefetch) size."""

    NONE = 0
    B64 = 1
    B128 = 2
    B256 = 3


class OobFill(enum.Enum):
    """What TMA loads outside the tensor read as."""

    ZERO = 0
    NAN = 1


@dataclass(frozen=True, slots=True)
class TiledFormat:
    """A tiled tensor map: boxes of ``tile_size`` elements (innermost first)."""

    tile_size: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Im2colFormat:
    """An im2col tensor map (convolution patches)."""

    pixel_box_lower_corner: tuple[int, ...]
    pixel_box_upper_corner: tuple[int, ...]
    channels_per_pixel: int
    pixels_per_column: int


@dataclass(frozen=True, slots=True)
class TensorMapMeta:
    """Metadata of a TMA tensor map over a buffer (shape/strides innermost first)."""

    format: TiledFormat | Im2colFormat
    rank: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    elem_stride: tuple[int, ...]
    storage_ty: np.dtype[np.generic]
    interleave: TensorMapInterleave = TensorMapInterleave.NONE
    swizzle: TensorMapSwizzle = TensorMapSwizzle.NONE
    prefetch: TensorMapPrefetch = TensorMapPrefetch.NONE
    oob_fill: OobFill = OobFill.ZERO


@dataclass(frozen=True, slots=True)
class TensorMapBinding:
    """A tensor map over a buffer binding, for TMA copies."""

    binding: Binding
    map: TensorMapMeta


class Bindings:
    """Everything a kernel is launched with.

    The ``with_*`` builders add to this object and return it, so calls chain:
    ``Bindings().with_buffers([a, b]).with_scalar(np.float32, [2.0])``.

    Attributes:
        buffers: Buffer bindings, in kernel-parameter order.
        metadata: Packed ``uint32`` metadata.
        scalars: Scalars grouped by dtype (one ``ScalarBinding`` per dtype).
        tensor_maps: TMA tensor maps.
    """

    __slots__ = ("buffers", "metadata", "scalars", "tensor_maps")

    def __init__(self) -> None:
        self.buffers: list[Binding] = []
        self.metadata = MetadataBinding()
        self.scalars: dict[np.dtype[np.generic], ScalarBinding] = {}
        self.tensor_maps: list[TensorMapBinding] = []

    def __repr__(self) -> str:
        return (
            f"Bindings(buffers={self.buffers}, metadata={self.metadata}, "
            f"scalars={list(self.scalars.values())}, tensor_maps={self.tensor_maps})"
        )

    def with_buffer(self, binding: Binding) -> Bindings:
        """Add one buffer binding."""
        self.buffers.append(_as_binding(binding))
        return self

    def with_buffers(self, bindings: Iterable[Binding]) -> Bindings:
        """Add buffer bindings in order."""
        self.buffers.extend(_as_binding(b) for b in bindings)
        return self

    def with_scalar(self, ty: npt.DTypeLike, values: npt.ArrayLike) -> Bindings:
        """Set the scalars of dtype ``ty`` (replacing any of that dtype)."""
        sb = ScalarBinding(ty, values)
        self.scalars[sb.ty] = sb
        return self

    def with_scalars(self, bindings: Iterable[ScalarBinding]) -> Bindings:
        """Set several scalar groups."""
        for sb in bindings:
            self.scalars[sb.ty] = sb
        return self

    def with_metadata(self, meta: MetadataBinding) -> Bindings:
        """Set the metadata."""
        self.metadata = meta
        return self

    def with_tensor_maps(self, bindings: Iterable[TensorMapBinding]) -> Bindings:
        """Add tensor maps in order."""
        self.tensor_maps.extend(bindings)
        return self

    def ordered_scalars(self) -> list[ScalarBinding]:
        """Scalar groups in ABI order (the order of ``SCALAR_DTYPES``)."""
        return sorted(self.scalars.values(), key=lambda s: _SCALAR_ORDER[s.ty])

    def all_bindings(self) -> list[Binding]:
        """Buffers, then the bindings behind tensor maps."""
        return self.buffers + [t.binding for t in self.tensor_maps]


def _as_binding(value: object) -> Binding:
    if isinstance(value, Binding):
        return value
    if isinstance(value, Handle):
        return value.binding()
    raise InvalidArgument(f"expected a Binding (or Handle), got {type(value).__name__}")


class CubeCount:
    """How many cubes (CUDA blocks) to launch: static ``(x, y, z)`` or read from a buffer.

    ``CubeCount(64)`` is ``(64, 1, 1)``; ``CubeCount.dynamic(binding)`` reads a ``uint32``
    triple ``[x, y, z]`` from the buffer when the launch runs.
    """

    __slots__ = ("binding", "x", "y", "z")

    def __init__(self, x: int = 1, y: int = 1, z: int = 1) -> None:
        for name, v in (("x", x), ("y", y), ("z", z)):
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2**32:
                raise InvalidArgument(f"CubeCount.{name} must be an int in [0, 2**32), got {v!r}")
        self.x, self.y, self.z = x, y, z
        self.binding: Binding | None = None

    @classmethod
    def dynamic(cls, binding: Binding | Handle) -> CubeCount:
        """A count read from ``binding`` (a ``uint32`` array ``[x, y, z]``) at launch."""
        out = cls()
        out.binding = _as_binding(binding)
        return out

    @property
    def is_dynamic(self) -> bool:
        """True when the count comes from a buffer."""
        return self.binding is not None

    def __repr__(self) -> str:
        if self.binding is not None:
            return f"CubeCount.dynamic({self.binding!r})"
        return f"CubeCount({self.x}, {self.y}, {self.z})"


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
        from .display import memory_usage_html

        return memory_usage_html(self)

    def __str__(self) -> str:
        return (
            f"{self.number_allocs} allocations, {_fmt_bytes(self.bytes_in_use)} in use, "
            f"{_fmt_bytes(self.bytes_padding)} padding, "
            f"{_fmt_bytes(self.bytes_reserved)} reserved"
        )


def _fmt_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _sole_refs() -> int:
    probe = Handle(SliceHandle(-1, ReleaseQueue(-1)), None, None, StreamId(0), 0, 0)
    return probe._slice_refs()


_SOLE_REFS: Final = _sole_refs()
