"""Numpy-level helpers on top of handles: a typed tensor view and data snapshots."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import InvalidArgument
from .types import Binding, CopyDescriptor, Handle

__all__ = ["Tensor", "as_bytes"]


class Tensor:
    """A handle with a dtype, shape and strides (in elements).

    Attributes:
        handle: The buffer.
        shape: The tensor's shape.
        strides: Strides in elements (pitched rows for OPTIMIZED allocations).
        dtype: The numpy dtype of the elements.
    """

    __slots__ = ("dtype", "handle", "shape", "strides")

    def __init__(
        self,
        handle: Handle,
        shape: Sequence[int],
        strides: Sequence[int],
        dtype: npt.DTypeLike,
    ) -> None:
        self.handle = handle
        self.shape = tuple(int(d) for d in shape)  # numpy integers become ints
        self.strides = tuple(int(s) for s in strides)
        self.dtype = np.dtype(dtype)

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape}, strides={self.strides}, dtype={self.dtype})"

    def __array__(self, dtype: object = None, copy: object = None) -> npt.NDArray[Any]:
        """Refused: the data lives on the client's server, and reading it is awaited."""
        raise InvalidArgument(
            "a Tensor's data lives on its client's server; read it with "
            "`await client.read_array(tensor)` instead of np.asarray(tensor)"
        )

    def binding(self) -> Binding:
        """A binding over the tensor's buffer."""
        return self.handle.binding()

    def copy_descriptor(self) -> CopyDescriptor:
        """A copy descriptor with this tensor's shape, strides and element size."""
        return self.handle.copy_descriptor(self.shape, self.strides, self.dtype.itemsize)


def as_bytes(data: Any) -> bytes | memoryview:
    """A snapshot of ``data``'s bytes: ``bytes`` as is, anything else copied now."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, np.ndarray):
        if data.dtype.hasobject:
            raise InvalidArgument(
                f"data: a numpy array of dtype {data.dtype} holds Python objects, not raw "
                "data; convert it to a numeric dtype first (e.g. .astype(np.float32))"
            )
        return np.ascontiguousarray(data).tobytes()
    try:
        view = memoryview(data)
    except TypeError as exc:
        raise InvalidArgument(
            f"expected bytes-like data or a numpy array, got {type(data).__name__}"
        ) from exc
    return view.tobytes()
