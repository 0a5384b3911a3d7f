"""Argument checks and conversions shared by the client's commands."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .bindings import Bindings, CubeCount
from .errors import BufferTooBig, InvalidArgument
from .kernel import Kernel
from .server import BytesLike
from .tensor import Tensor
from .types import Binding, CopyDescriptor, ExecutionMode, Handle

DataLike = BytesLike | npt.NDArray[Any]
"""What ``create`` and ``write`` take: bytes-like objects or numpy arrays."""


def _forget_staging(
    registry: dict[int, weakref.ref[npt.NDArray[np.uint8]]], key: int, _: object
) -> None:
    registry.pop(key, None)


def _whole(value: object) -> CopyDescriptor:
    if isinstance(value, Handle):
        value = value.binding()
    if not isinstance(value, Binding):
        raise InvalidArgument(f"expected a Binding or Handle, got {type(value).__name__}")
    size = value.size
    return CopyDescriptor(value, (size,), (1,), 1)


def _descriptor(value: object) -> CopyDescriptor:
    if isinstance(value, Tensor):
        return value.copy_descriptor()
    if not isinstance(value, CopyDescriptor):
        raise InvalidArgument(
            f"expected a CopyDescriptor (handle.copy_descriptor(shape, strides, elem_size)), "
            f"got {type(value).__name__}"
        )
    return value


def _same_length(**seqs: Sequence[Any]) -> None:
    lengths = {name: len(s) for name, s in seqs.items()}
    if len(set(lengths.values())) > 1:
        raise InvalidArgument(f"these must have the same length: {lengths}")
    for shape in seqs.get("shapes", ()):
        if any(not isinstance(d, int) or d < 0 for d in shape):
            raise BufferTooBig(-1, f"shape {tuple(shape)} has a negative or non-int dimension")
    for elem in seqs.get("elem_sizes", ()):
        if not isinstance(elem, int) or elem <= 0:
            raise InvalidArgument(f"elem_size must be a positive int, got {elem!r}")


def _bad_execute(kernel: object, count: object, bindings: object, mode: object) -> None:
    for name, value, cls in (
        ("kernel", kernel, Kernel),
        ("count", count, CubeCount),
        ("bindings", bindings, Bindings),
        ("mode", mode, ExecutionMode),
    ):
        if not isinstance(value, cls):
            raise InvalidArgument(f"execute: {name} must be a {cls.__name__}, got {value!r}")
