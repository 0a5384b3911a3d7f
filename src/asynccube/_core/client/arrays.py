"""The numpy side of a client: tensors made from arrays, typed views of handles, arrays
read back with their dtype and shape, and DLPack imports. Each function is the body of
the :class:`~.client.ComputeClient` method of the same name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgument
from ..server.layout import contiguous_strides
from ..values.types import AllocationKind, Binding, CopyDescriptor, Handle
from .args import _array_layout, _dims, _foreign, _numeric_dtype, _same_as_tensor, _whole
from .interop import import_dlpack, tensor_strides
from .parts import ClientParts
from .tensor import Tensor

__all__ = ["create_array", "empty_array", "from_dlpack", "read_array", "tensor"]


def create_array(client: ClientParts, handle: Handle, arr: npt.NDArray[Any]) -> Tensor:
    """The tensor of ``client.create_array``, over the new ``handle`` holding ``arr``."""
    return Tensor(handle, arr.shape, tensor_strides(arr.shape, None), arr.dtype, client)


def empty_array(
    client: ClientParts, shape: Sequence[int], dtype: npt.DTypeLike, kind: AllocationKind
) -> Tensor:
    """See :meth:`ComputeClient.empty_array`."""
    dt, dims = _numeric_dtype("empty_array: dtype", dtype), _dims("empty_array: shape", shape)
    ((handle, strides),) = client._memory.empty_tensors([dims], [dt.itemsize], kind)
    return Tensor(handle, dims, strides, dt, client)


def tensor(
    client: ClientParts,
    handle: Handle,
    shape: Sequence[int],
    dtype: npt.DTypeLike,
    strides: Sequence[int] | None,
) -> Tensor:
    """See :meth:`ComputeClient.tensor`."""
    if not isinstance(handle, Handle):
        raise InvalidArgument(
            f"tensor: handle must be a Handle (client.create/empty), got {type(handle).__name__}"
        )
    owner = getattr(client.server, "handle_owner", None)
    if owner is not None and handle.memory.queue is not owner:
        raise _foreign("tensor", handle)
    dt = _numeric_dtype("tensor: dtype", dtype)
    view = Tensor(handle, shape, tensor_strides(shape, strides), dt, client)
    needed = view.nbytes_spanned()
    if needed > handle.size:
        raise InvalidArgument(
            f"{view!r} addresses {needed} bytes but {handle!r} holds {handle.size}"
        )
    return view


def from_dlpack(client: ClientParts, obj: Any, device: Any, copy: Any) -> Tensor:
    """See :meth:`ComputeClient.from_dlpack`."""
    handle, shape, dtype = import_dlpack(client, obj, device, copy)
    return Tensor(handle, shape, contiguous_strides(shape), dtype, client)


async def read_array(
    client: ClientParts,
    source: Tensor | Binding | Handle,
    dtype: npt.DTypeLike | None,
    shape: Sequence[int] | None,
) -> npt.NDArray[Any]:
    """See :meth:`ComputeClient.read_array`."""
    if isinstance(source, Tensor):
        _same_as_tensor(source, dtype, shape)
        client._channel.check()
        return await _read_new(client, source.copy_descriptor(), source.dtype, source.shape)
    if dtype is None:
        raise InvalidArgument("read_array of a Handle or Binding needs dtype=")
    dt, dims = _array_layout(source, dtype, shape)
    client._channel.check()
    return await _read_new(client, _whole(source), dt, dims, source)


async def _read_new(
    client: ClientParts,
    desc: CopyDescriptor,
    dt: np.dtype[Any],
    dims: tuple[int, ...] | None,
    buffer: Binding | Handle | None = None,
) -> npt.NDArray[Any]:
    """``read_array``'s read: a new array of ``desc``'s data, made by the server off
    the loop where it can (host), else copied from the bytes read."""
    # No local keeps a future: a failed one's error would hold this frame (its
    # traceback) and the frame the future, a cycle only the gc breaks (issue 28).
    movement = client._movement
    pending: list[Any] = [movement.read_arrays([desc])]
    flat: npt.NDArray[Any]
    if pending[0] is not None:
        (raw,) = await _take(pending)
        flat = raw.view(dt)
    else:  # one copy, into the new array (CUDA: from the pinned buffer the device filled)
        flat = np.empty(desc.nbytes // dt.itemsize, dtype=dt)
        pending[0] = movement.read_into(desc, flat)
        await _take(pending)
    return flat if dims is None else flat.reshape(dims)


async def _take(pending: list[Any]) -> Any:
    """Await the future in ``pending``, taking it out first (see ``_read_new``)."""
    return await pending.pop()
