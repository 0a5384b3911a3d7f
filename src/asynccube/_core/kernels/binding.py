"""A call's arguments checked and sorted: array arguments (tensors of one client, one
shape, contiguous, of a supported dtype), scalar arguments (numbers) and outputs.

A call's host work is part of what a kernel written once costs (issue 38: at most a
CuPy ``ElementwiseKernel`` call's), so the checks here are the cheap ones (a set
lookup, the contiguous strides of a shape computed once), and the values every call of
one size or of the same scalars builds (metadata, scalar groups, cube counts) are made
once and shared: each is read-only once built."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, TypeVar

import numpy as np

from ..client.client import ComputeClient
from ..client.tensor import Tensor
from ..errors import InvalidArgument
from ..server.layout import contiguous_strides
from ..values.bindings import Bindings, CubeCount, MetadataBinding, ScalarBinding
from ..values.kernel import Kernel
from .dtypes import SUPPORTED, Ty, param_dtype, type_of_scalar
from .typing import TypeContext, check_int_range

__all__ = [
    "CallArgs",
    "KernelLaunch",
    "check_scalar_ranges",
    "cube_count",
    "new_bindings",
    "read_args",
    "remember",
    "scalar_bindings",
    "scalar_groups",
]

_INT64 = np.iinfo(np.int64)
_SUPPORTED: Final = frozenset(SUPPORTED)
_CACHE_MAX: Final = 1024
"""Entries each shared-value cache keeps (cleared when full)."""
_K = TypeVar("_K")
_V = TypeVar("_V")
_STRIDES: dict[tuple[int, ...], tuple[int, ...]] = {}
_METADATA: dict[tuple[int, ...], MetadataBinding] = {}
_CUBES: dict[int, CubeCount] = {}
_SCALARS: dict[tuple[Any, ...], ScalarBinding] = {}
_ALLOWED: dict[tuple[tuple[str, ...], tuple[str, ...]], frozenset[str]] = {}


def remember(cache: dict[_K, _V], key: _K, value: _V) -> _V:
    """``cache[key] = value`` in a cache of shared values bounded to ``_CACHE_MAX``
    entries (cleared when full); returns ``value``."""
    if len(cache) >= _CACHE_MAX:
        cache.clear()
    cache[key] = value
    return value


class KernelLaunch(NamedTuple):
    """One launch of a kernel written once, as ``client.execute`` takes it:
    ``client.execute(*launch)``."""

    kernel: Kernel
    cubes: CubeCount
    bindings: Bindings


@dataclass(frozen=True, slots=True)
class CallArgs:
    """A call's arguments: tensors and scalars by name, each name's type, the shape."""

    tensors: dict[str, Tensor]
    scalars: dict[str, Any]
    types: dict[str, Ty]
    shape: tuple[int, ...] | None
    size: int
    """Elements of the common shape (0 without tensors)."""


def read_args(
    what: str,
    client: ComputeClient,
    inputs: Sequence[str],
    optional: Iterable[str],
    given: Mapping[str, Any],
) -> CallArgs:
    """Sort ``given`` into tensors and scalars; InvalidArgument for a missing input, an
    unknown name, a tensor of another client, dtype, shape or layout."""
    key = (tuple(inputs), tuple(optional))
    allowed = _ALLOWED.get(key)
    if allowed is None:
        allowed = remember(_ALLOWED, key, frozenset(key[0] + key[1]))
    if not given.keys() <= allowed or not all(name in given for name in key[0]):
        _check_names(what, key[0], key[1], given)
    tensors: dict[str, Tensor] = {}
    scalars: dict[str, Any] = {}
    types: dict[str, Ty] = {}
    shape: tuple[int, ...] | None = None
    for name, value in given.items():
        kind = type(value)
        if kind is Tensor or isinstance(value, Tensor):
            types[name] = _tensor_dtype(what, client, name, value)
            tensors[name] = value
            if shape is None:
                shape = value.shape
            elif value.shape != shape:
                _common_shape(what, tensors)
            continue
        if kind is float or (kind is int and _INT64.min <= value <= _INT64.max):
            types[name] = kind
        else:
            types[name] = _scalar_type(what, name, value)
        scalars[name] = value
    size = 0 if shape is None else (shape[0] if len(shape) == 1 else math.prod(shape))
    return CallArgs(tensors, scalars, types, shape, size)


def _check_names(
    what: str, inputs: Sequence[str], optional: Iterable[str], given: Mapping[str, Any]
) -> None:
    allowed = [*inputs, *(o for o in optional if o not in inputs)]
    unknown = [name for name in given if name not in allowed]
    if unknown:
        raise InvalidArgument(f"{what}: unknown argument(s) {unknown}; it takes {allowed}")
    missing = [name for name in inputs if name not in given]
    if missing:
        raise InvalidArgument(f"{what}: missing argument(s) {missing}; it takes {allowed}")


def _tensor_dtype(what: str, client: ComputeClient, name: str, tensor: Tensor) -> np.dtype[Any]:
    owner = tensor._client() if tensor._client is not None else None
    if owner is not client:
        raise InvalidArgument(f"{what}: tensor {name!r} was not made by this client")
    dtype = tensor.dtype
    if dtype not in _SUPPORTED:
        raise InvalidArgument(
            f"{what}: tensor {name!r} has dtype {tensor.dtype}; supported: "
            + ", ".join(map(str, SUPPORTED))
        )
    shape = tensor.shape
    strides = _STRIDES.get(shape)
    if strides is None:
        strides = remember(_STRIDES, shape, contiguous_strides(shape))
    if tensor.strides != strides:
        raise InvalidArgument(
            f"{what}: tensor {name!r} is not C-contiguous (strides {tensor.strides}); "
            "make a contiguous copy (client.empty_array + a copy kernel) first"
        )
    return dtype


def _scalar_type(what: str, name: str, value: Any) -> Ty:
    if isinstance(value, np.ndarray):
        raise InvalidArgument(
            f"{what}: argument {name!r} is a numpy array; pass client.create_array(...) "
            "(a Tensor) for an array argument"
        )
    try:
        ty = type_of_scalar(name, value)
    except InvalidArgument as error:
        raise InvalidArgument(f"{what}: {error}") from None
    if ty is int and not _INT64.min <= value <= _INT64.max:
        raise InvalidArgument(f"{what}: scalar {name!r} = {value} does not fit int64")
    return ty


def _common_shape(what: str, tensors: Mapping[str, Tensor]) -> tuple[int, ...] | None:
    shapes = {name: t.shape for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise InvalidArgument(f"{what}: array arguments must have one shape, got {listed}")
    return next(iter(shapes.values()), None)


def check_scalar_ranges(ctx: TypeContext, scalars: Mapping[str, Any]) -> None:
    """Each weak int scalar fits the integer dtypes it meets (as numpy requires)."""
    for name, dtypes in ctx.int_targets.items():
        for dt in dtypes:
            check_int_range(f"scalar {name!r} = {scalars[name]}", int(scalars[name]), dt, ctx.text)


def new_bindings(buffers: list[Any]) -> Bindings:
    """Bindings over ``buffers`` (Binding objects, already checked)."""
    bindings = Bindings()
    bindings.buffers = buffers
    return bindings


ScalarGroups = tuple[tuple[np.dtype[Any], tuple[str, ...]], ...]
"""The scalar arguments by the dtype they are passed as, in ABI order."""


def scalar_groups(ordered: Sequence[tuple[str, Ty]]) -> ScalarGroups:
    """The scalars (already in ABI order) grouped by the dtype they are passed as."""
    groups: dict[np.dtype[Any], list[str]] = {}
    for name, ty in ordered:
        groups.setdefault(param_dtype(ty), []).append(name)
    return tuple((dt, tuple(names)) for dt, names in groups.items())


def scalar_bindings(
    bindings: Bindings, groups: ScalarGroups, scalars: Mapping[str, Any]
) -> Bindings:
    """``bindings`` with the scalars added, group by group (a group of the same values
    as an earlier call's: the ScalarBinding made then)."""
    for dt, names in groups:
        values = [scalars[name] for name in names]
        key = (dt, *[(type(v), v) for v in values])
        try:
            sb = _SCALARS.get(key)
        except TypeError:  # an unhashable value: ScalarBinding says what is wrong
            sb = None
        if sb is None:
            values = [int(v) if isinstance(v, bool | np.bool_) else v for v in values]
            sb = ScalarBinding(dt, values)
            if all(_keyable(v) for v in values):
                remember(_SCALARS, key, sb)
        bindings.scalars[sb.ty] = sb
    return bindings


def _keyable(value: Any) -> bool:
    """Whether equal keys mean equal bits: not a NaN (never equal to itself) nor a float
    zero (``-0.0 == 0.0``)."""
    return bool(value == value) and (value != 0 or isinstance(value, int | np.integer))


def count_metadata(*counts: int) -> MetadataBinding:
    """Each count as two uint32 words (low, high), shared by every call of those
    counts (read-only)."""
    meta = _METADATA.get(counts)
    if meta is None:
        words: list[int] = []
        for n in counts:
            words += [n & 0xFFFFFFFF, n >> 32]
        meta = MetadataBinding(np.array(words, np.uint32))
        meta.data.flags.writeable = False
        remember(_METADATA, counts, meta)
    return meta


def cube_count(blocks: int) -> CubeCount:
    """``CubeCount(blocks)``, shared by every launch of that many blocks."""
    cubes = _CUBES.get(blocks)
    if cubes is None:
        cubes = remember(_CUBES, blocks, CubeCount(blocks))
    return cubes
