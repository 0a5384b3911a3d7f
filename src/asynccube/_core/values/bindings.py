"""Launch arguments: what a kernel is given (``Bindings``: buffers, scalars by dtype,
metadata, tensor maps) and how many cubes run (``CubeCount``).

Like the value types in :mod:`.types`, these are small classes built on the launch path.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgument, ScalarTypeError
from .types import Binding, Handle

__all__ = [
    "Bindings",
    "CubeCount",
    "Im2colFormat",
    "MetadataBinding",
    "NUMERIC_DTYPES",
    "OobFill",
    "SCALAR_DTYPES",
    "ScalarBinding",
    "TensorMapBinding",
    "TensorMapInterleave",
    "TensorMapMeta",
    "TensorMapPrefetch",
    "TensorMapSwizzle",
    "TiledFormat",
    "scalar_dtype",
]


NUMERIC_DTYPES: Final = (
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
)
"""The numeric element types (numpy names, narrowest first within each kind): what the
collectives reduce, and with ``bool`` what a kernel written once takes."""

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
        return _NORMALIZED[ty]
    except (KeyError, TypeError):  # not seen yet, or unhashable
        pass
    try:
        dt = np.dtype(ty)
    except TypeError as exc:
        raise ScalarTypeError(f"{ty!r} is not a numpy dtype") from exc
    native = _NATIVE.get(dt.newbyteorder("="))
    if native is None:
        names = ", ".join(d.name for d in SCALAR_DTYPES)
        raise ScalarTypeError(f"scalar dtype {dt} is not supported; use one of {names}")
    if len(_NORMALIZED) < _NORMALIZED_MAX:
        try:
            _NORMALIZED[ty] = native
        except TypeError:
            pass
    return native


_NATIVE: Final = {dt: dt for dt in SCALAR_DTYPES}
"""Each supported dtype (any byte order compares equal to its native one) to the one
dtype object of ``SCALAR_DTYPES``, so every binding of a dtype shares one object."""
_NORMALIZED: dict[object, np.dtype[np.generic]] = {}
"""``scalar_dtype``'s answers by what it was given (``np.uint32``, ``"uint32"``...)."""
_NORMALIZED_MAX: Final = 256
_PACK: Final = dict(zip(SCALAR_DTYPES, "dfeqihbQIHB", strict=True))
"""The ``struct`` code of each scalar dtype (native byte order, standard size)."""
_INT_RANGE: Final = {
    dt: (int(np.iinfo(dt.str).min), int(np.iinfo(dt.str).max))
    for dt in SCALAR_DTYPES
    if dt.kind in "iu"
}
_FLOAT_MAX: Final = {dt: float(np.finfo(dt.str).max) for dt in SCALAR_DTYPES if dt.kind == "f"}


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
        if isinstance(values, np.ndarray):
            arr = _scalar_array(dt, values)
            length, raw = int(arr.size), arr.tobytes()
        else:  # Python numbers and numpy scalars: checked one by one, packed without numpy
            items = list(values) if isinstance(values, Iterable) else [values]
            length = len(items)
            raw = struct.pack(f"={length}{_PACK[dt]}", *[_checked_scalar(dt, v) for v in items])
        self.ty = dt
        self.length = length
        self.data = raw + b"\0" * (-len(raw) % 8)
        self._values: npt.NDArray[np.generic] | None = None

    def __repr__(self) -> str:
        return f"ScalarBinding({self.ty}, {self.values().tolist()})"

    def values(self) -> npt.NDArray[np.generic]:
        """The scalars as a numpy array of ``ty`` (a read-only view of ``data``)."""
        if self._values is None:
            self._values = np.frombuffer(self.data, dtype=self.ty, count=self.length)
        return self._values


def _scalar_array(
    dt: np.dtype[np.generic], values: npt.NDArray[np.generic]
) -> npt.NDArray[np.generic]:
    if values.dtype != dt:
        raise ScalarTypeError(_mismatch(dt, values))
    return np.ascontiguousarray(values, dtype=dt).reshape(-1)


def _mismatch(dt: np.dtype[np.generic], values: npt.NDArray[Any]) -> str:
    """Why an array of another dtype than the declared ``dt`` is refused: a value that
    does not fit ``dt`` (as the Python-number path says it), else the cast to make
    (safe then: every value fits). Vectorised (min/max), off the matching-dtype path."""
    unfit = _first_unfit(dt, values)
    if unfit:
        return unfit
    if values.dtype.kind not in "iuf":
        return (
            f"scalars declared {dt} but given an array of {values.dtype}; convert the "
            f"values to numbers of {dt}, or declare another scalar dtype"
        )
    return (
        f"scalars declared {dt} but given an array of {values.dtype}; every value fits, so "
        f"cast with .astype(np.{dt.name}), or declare {values.dtype}"
    )


def _first_unfit(dt: np.dtype[np.generic], values: npt.NDArray[Any]) -> str:
    """The refusal of the first value of ``values`` (ints or floats) that ``dt`` cannot
    hold exactly in range (``""`` if none): ``-1 does not fit in uint32``."""
    kind = values.dtype.kind
    if values.size == 0 or kind not in "iuf":
        return ""
    if dt.kind in "iu" and kind == "f":
        whole = np.isfinite(values) & (values == np.trunc(values))
        if not whole.all():
            bad = values[~whole].reshape(-1)[0]
            return f"scalar {bad.item()!r} (in the array given) is not an integer for dtype {dt}"
    if dt.kind in "iu":
        lo, hi = _INT_RANGE[dt]
        low, high = values.min().item(), values.max().item()
        if low < lo or high > hi:
            bad = low if low < lo else high
            return f"scalar {bad!r} (in the array given) does not fit in {dt}"
        return ""
    limit = _FLOAT_MAX[dt]
    finite = values[np.isfinite(values)] if kind == "f" else values
    if finite.size:
        low, high = finite.min().item(), finite.max().item()
        bad = low if -low > limit else high if high > limit else None
        if bad is not None:
            return (
                f"scalar {bad!r} (in the array given) does not fit in {dt} (largest "
                f"magnitude {limit:g}); declare a wider dtype"
            )
    return ""


def _checked_scalar(dt: np.dtype[np.generic], value: object) -> object:
    if isinstance(value, np.generic):
        if value.dtype == dt:
            return value
        if isinstance(value, np.integer):  # numpy integers are ordinary ints
            value = int(value)
        elif isinstance(value, np.floating) and dt.kind == "f":
            value = float(value)
        else:
            raise ScalarTypeError(
                f"scalar {value!r} is a {value.dtype}, not a {dt}; convert it or declare "
                f"{value.dtype}"
            )
    kind = dt.kind
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScalarTypeError(f"scalar {value!r} is not a number for dtype {dt}")
    if kind in "iu":
        if not isinstance(value, int) and not float(value).is_integer():
            raise ScalarTypeError(f"scalar {value!r} is not an integer for dtype {dt}")
        lo, hi = _INT_RANGE[dt]
        if not lo <= int(value) <= hi:
            raise ScalarTypeError(f"scalar {value!r} does not fit in {dt}")
        return int(value)
    limit = _FLOAT_MAX[dt]
    try:
        magnitude = abs(float(value))
    except OverflowError:  # an int beyond any float
        magnitude = math.inf
    if magnitude > limit and (isinstance(value, int) or math.isfinite(value)):
        raise ScalarTypeError(
            f"scalar {value!r} does not fit in {dt} (largest magnitude {limit:g}); "
            "declare a wider dtype, or pass inf explicitly"
        )
    return value


_SCALARS: dict[tuple[Any, ...], ScalarBinding] = {}
"""``with_scalar``'s ScalarBindings of a few Python ints, by (dtype given, values...)."""
_SCALARS_MAX: Final = 256


def _scalars(ty: npt.DTypeLike, values: object) -> ScalarBinding:
    """``ScalarBinding(ty, values)``; for a list of up to 4 Python ints (exactly ``int``:
    a request's sizes, passed anew to every launch) one shared ScalarBinding per dtype
    and values, checked and packed once (it is never changed once built). Bad values
    raise every time (a refused one is not kept)."""
    if type(values) is not list or not 0 < len(values) <= 4:
        return ScalarBinding(ty, values)  # type: ignore[arg-type]  # it checks them
    for v in values:
        if type(v) is not int:
            return ScalarBinding(ty, values)
    key = (ty, *values)
    try:
        return _SCALARS[key]
    except (KeyError, TypeError):  # TypeError: an unhashable dtype-like (ScalarBinding says)
        pass
    sb = ScalarBinding(ty, values)
    if len(_SCALARS) >= _SCALARS_MAX:
        _SCALARS.clear()
    _SCALARS[key] = sb
    return sb


_NO_METADATA: Final = np.zeros(0, dtype=np.uint32)
"""The data of every empty MetadataBinding (no element to change: read-only, shared)."""
_NO_METADATA.flags.writeable = False


class MetadataBinding:
    """Packed ``uint32`` metadata of a launch (shapes, strides, lengths)."""

    __slots__ = ("data", "static_len")

    def __init__(self, data: npt.ArrayLike = (), static_len: int = 0) -> None:
        if isinstance(data, tuple) and not data:  # a Bindings' default: no array built
            self.data: npt.NDArray[np.uint32] = _NO_METADATA
        else:
            self.data = np.asarray(data, dtype=np.uint32).reshape(-1)
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

    def with_buffer(self, binding: Binding | Handle) -> Bindings:
        """Add one buffer binding (a Handle stands for its whole binding)."""
        self.buffers.append(_as_binding(binding, "with_buffer: binding"))
        return self

    def with_buffers(self, bindings: Iterable[Binding | Handle]) -> Bindings:
        """Add buffer bindings in order (a Handle stands for its whole binding)."""
        if type(bindings) not in (list, tuple):
            bindings = _listed("with_buffers", "bindings", bindings, "[a, b]")
        buffers = self.buffers
        n = len(buffers)
        for b in bindings:  # Bindings as they are (the common case: no call per item)
            if type(b) is not Binding:
                del buffers[n:]  # all or nothing, as one extend
                buffers.extend(
                    [_as_binding(b, "with_buffers: bindings", i) for i, b in enumerate(bindings)]
                )
                break
            buffers.append(b)
        return self

    def with_scalar(self, ty: npt.DTypeLike, values: npt.ArrayLike) -> Bindings:
        """Set the scalars of dtype ``ty`` (replacing any of that dtype)."""
        sb = _scalars(ty, values)
        self.scalars[sb.ty] = sb
        return self

    def with_scalars(self, bindings: Iterable[ScalarBinding]) -> Bindings:
        """Set several scalar groups."""
        for sb in _listed("with_scalars", "bindings", bindings, "[ScalarBinding(...)]"):
            if not isinstance(sb, ScalarBinding):
                raise InvalidArgument(
                    f"with_scalars: bindings must hold ScalarBindings, got {type(sb).__name__}; "
                    "for plain numbers use with_scalar(dtype, [values])"
                )
            self.scalars[sb.ty] = sb
        return self

    def with_metadata(self, meta: MetadataBinding) -> Bindings:
        """Set the metadata."""
        if not isinstance(meta, MetadataBinding):
            raise InvalidArgument(
                f"with_metadata: meta must be a MetadataBinding, got {type(meta).__name__}; "
                "e.g. MetadataBinding([shape..., strides...])"
            )
        self.metadata = meta
        return self

    def with_tensor_maps(self, bindings: Iterable[TensorMapBinding]) -> Bindings:
        """Add tensor maps in order."""
        maps = _listed("with_tensor_maps", "bindings", bindings, "[TensorMapBinding(...)]")
        for t in maps:
            if not isinstance(t, TensorMapBinding):
                raise InvalidArgument(
                    f"with_tensor_maps: bindings must hold TensorMapBindings, got "
                    f"{type(t).__name__}"
                )
        self.tensor_maps.extend(maps)
        return self

    def ordered_scalars(self) -> list[ScalarBinding]:
        """Scalar groups in ABI order (the order of ``SCALAR_DTYPES``)."""
        return sorted(self.scalars.values(), key=lambda s: _SCALAR_ORDER[s.ty])

    def all_bindings(self) -> list[Binding]:
        """Buffers, then the bindings behind tensor maps."""
        return self.buffers + [t.binding for t in self.tensor_maps]


def _as_binding(value: object, name: str = "binding", index: int | None = None) -> Binding:
    if isinstance(value, Binding):
        return value
    if isinstance(value, Handle):
        return value.binding()
    where = name if index is None else f"{name}[{index}]"
    raise InvalidArgument(
        f"{where} must be a Handle or Binding, got {type(value).__name__}; "
        "pass the handle that client.create/empty returned (or tensor.handle)"
    )


def _listed(method: str, name: str, value: object, example: str) -> list[Any]:
    """``value`` (an iterable of items, not a single item) as a list, or
    InvalidArgument naming the argument (``with_buffers(None)``, ``with_buffers(h)``)."""
    if isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping):
        return list(value)
    raise InvalidArgument(
        f"{method}: {name} must be a list, got {type(value).__name__}; "
        f"e.g. Bindings().{method}({example})"
    )


def _is_int(value: object) -> bool:
    """True for ints and numpy integers (not bools)."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


class CubeCount:
    """How many cubes (CUDA blocks) to launch: static ``(x, y, z)`` or read from a buffer.

    ``CubeCount(64)`` is ``(64, 1, 1)``; ``CubeCount.dynamic(binding)`` reads a ``uint32``
    triple ``[x, y, z]`` from the buffer when the launch runs.
    """

    __slots__ = ("binding", "x", "y", "z")

    def __init__(self, x: int = 1, y: int = 1, z: int = 1) -> None:
        for name, v in (("x", x), ("y", y), ("z", z)):
            if not _is_int(v) or not 0 <= v < 2**32:
                raise InvalidArgument(f"CubeCount.{name} must be an int in [0, 2**32), got {v!r}")
        self.x, self.y, self.z = int(x), int(y), int(z)
        self.binding: Binding | None = None

    @classmethod
    def dynamic(cls, binding: Binding | Handle) -> CubeCount:
        """A count read from ``binding`` (a ``uint32`` array ``[x, y, z]``) at launch."""
        out = cls()
        out.binding = _as_binding(binding, "CubeCount.dynamic: binding")
        return out

    @property
    def is_dynamic(self) -> bool:
        """True when the count comes from a buffer."""
        return self.binding is not None

    def __repr__(self) -> str:
        if self.binding is not None:
            return f"CubeCount.dynamic({self.binding!r})"
        return f"CubeCount({self.x}, {self.y}, {self.z})"
