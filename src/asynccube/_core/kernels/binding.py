"""A call's arguments checked and sorted: array arguments (tensors of one client, one
shape, contiguous, of a supported dtype), scalar arguments (numbers) and outputs."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..client.client import ComputeClient
from ..client.tensor import Tensor
from ..errors import InvalidArgument
from ..server.layout import contiguous_strides
from ..values.bindings import Bindings, CubeCount, MetadataBinding
from ..values.kernel import Kernel
from .dtypes import SUPPORTED, Ty, param_dtype, type_of_scalar
from .typing import TypeContext, check_int_range

__all__ = ["CallArgs", "KernelLaunch", "check_scalar_ranges", "read_args", "scalar_bindings"]

_INT64 = np.iinfo(np.int64)


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

    @property
    def size(self) -> int:
        """Elements of the common shape."""
        return math.prod(self.shape) if self.shape is not None else 0


def read_args(
    what: str,
    client: ComputeClient,
    inputs: Sequence[str],
    optional: Iterable[str],
    given: Mapping[str, Any],
) -> CallArgs:
    """Sort ``given`` into tensors and scalars; InvalidArgument for a missing input, an
    unknown name, a tensor of another client, dtype, shape or layout."""
    allowed = [*inputs, *(o for o in optional if o not in inputs)]
    unknown = [name for name in given if name not in allowed]
    if unknown:
        raise InvalidArgument(f"{what}: unknown argument(s) {unknown}; it takes {allowed}")
    missing = [name for name in inputs if name not in given]
    if missing:
        raise InvalidArgument(f"{what}: missing argument(s) {missing}; it takes {allowed}")
    tensors: dict[str, Tensor] = {}
    scalars: dict[str, Any] = {}
    types: dict[str, Ty] = {}
    for name, value in given.items():
        if isinstance(value, Tensor):
            types[name] = _tensor_dtype(what, client, name, value)
            tensors[name] = value
        else:
            types[name] = _scalar_type(what, name, value)
            scalars[name] = value
    return CallArgs(tensors, scalars, types, _common_shape(what, tensors))


def _tensor_dtype(what: str, client: ComputeClient, name: str, tensor: Tensor) -> np.dtype[Any]:
    owner = tensor._client() if tensor._client is not None else None
    if owner is not client:
        raise InvalidArgument(f"{what}: tensor {name!r} was not made by this client")
    if tensor.dtype not in SUPPORTED:
        raise InvalidArgument(
            f"{what}: tensor {name!r} has dtype {tensor.dtype}; supported: "
            + ", ".join(map(str, SUPPORTED))
        )
    if tensor.strides != contiguous_strides(tensor.shape):
        raise InvalidArgument(
            f"{what}: tensor {name!r} is not C-contiguous (strides {tensor.strides}); "
            "make a contiguous copy (client.empty_array + a copy kernel) first"
        )
    return tensor.dtype


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


def scalar_bindings(
    bindings: Bindings, ordered: Sequence[tuple[str, Ty]], scalars: Mapping[str, Any]
) -> Bindings:
    """``bindings`` with the scalars (already in ABI order) added, group by group."""
    groups: dict[np.dtype[Any], list[Any]] = {}
    for name, ty in ordered:
        value = scalars[name]
        value = int(value) if isinstance(value, bool | np.bool_) else value
        groups.setdefault(param_dtype(ty), []).append(value)
    for dt, values in groups.items():
        bindings = bindings.with_scalar(dt, values)
    return bindings


def count_metadata(*counts: int) -> MetadataBinding:
    """Each count as two uint32 words (low, high)."""
    words: list[int] = []
    for n in counts:
        words += [n & 0xFFFFFFFF, n >> 32]
    return MetadataBinding(np.array(words, np.uint32))
