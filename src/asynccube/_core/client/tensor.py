"""A typed tensor view on top of a handle (its DLPack exports are in :mod:`.interop`)."""

from __future__ import annotations

import operator
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgument
from ..values.types import Binding, CopyDescriptor, Handle
from .interop import cuda_array_interface, dlpack_device, export_dlpack
from .views import TensorClient

__all__ = ["Tensor"]


class Tensor:
    """A handle with a dtype, shape and strides (in elements).

    Attributes:
        handle: The buffer.
        shape: The tensor's shape.
        strides: Strides in elements (pitched rows for OPTIMIZED allocations).
        dtype: The numpy dtype of the elements.

    A tensor made by a client (``client.tensor``, ``create_array``, ``empty_array``,
    ``from_dlpack``) exports its memory through DLPack without a copy:
    ``np.from_dlpack(tensor)`` on the host server (see :mod:`.interop`).
    """

    __slots__ = ("_client", "dtype", "handle", "shape", "strides")

    def __init__(
        self,
        handle: Handle,
        shape: Sequence[int],
        strides: Sequence[int],
        dtype: npt.DTypeLike,
        client: TensorClient | None = None,
    ) -> None:
        self._client = None if client is None else weakref.ref(client)
        self.handle = handle
        self.shape = tuple(map(int, shape))  # numpy integers become ints
        self.strides = tuple(map(int, strides))
        self.dtype = np.dtype(dtype)

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape}, strides={self.strides}, dtype={self.dtype})"

    def __array__(self, dtype: object = None, copy: object = None) -> npt.NDArray[Any]:
        """Refused: the data lives on the client's server, and reading it is awaited."""
        raise InvalidArgument(
            "a Tensor's data lives on its client's server; read it with "
            "`await client.read_array(tensor)` instead of np.asarray(tensor)"
        )

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """A DLPack capsule sharing this tensor's memory (versioned when the consumer
        passes ``max_version`` >= (1, 0)). The memory stays valid until the consumer
        releases it (the capsule's deleter), after the tensor is dropped and after
        ``client.close()`` too. Raises DLPackError (never a bare BufferError) when it
        cannot be shared (see :mod:`.interop`)."""
        return export_dlpack(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(device type, index)``: ``(1, 0)`` (kDLCPU) on the host server,
        ``(2, N)`` (kDLCUDA) on ``cuda:N``."""
        return dlpack_device(self)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA Array Interface v3 on a CUDA client (with ``stream``: the consumer
        orders its work after asynccube's); AttributeError for host memory."""
        return cuda_array_interface(self)

    def nbytes_spanned(self) -> int:
        """Bytes from the first element to just past the last one addressed."""
        shape = self.shape
        if 0 in shape:
            return 0
        strides = self.strides
        if len(strides) != len(shape):
            raise ValueError(f"{self!r}: one stride per dimension is needed")
        last: int = sum(map(operator.mul, shape, strides)) - sum(strides)  # sum of (d - 1) * s
        return (last + 1) * self.dtype.itemsize

    def binding(self) -> Binding:
        """A binding over the tensor's buffer."""
        return self.handle.binding()

    def copy_descriptor(self) -> CopyDescriptor:
        """A copy descriptor with this tensor's shape, strides and element size."""
        return self.handle.copy_descriptor(self.shape, self.strides, self.dtype.itemsize)
