"""Argument checks and conversions shared by the client's commands."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgument, InvalidHandle
from ..server.launch_limits import grid_problem
from ..server.protocol import BytesLike
from ..values.bindings import Bindings, CubeCount
from ..values.kernel import Kernel
from ..values.types import Binding, CopyDescriptor, ExecutionMode, Handle
from .tensor import Tensor

ShapeLike = Sequence[int] | None

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


def _read_item(value: object) -> CopyDescriptor:
    """What ``read`` reads of ``value``: a tensor's elements (densely packed), a
    binding's or handle's whole bytes."""
    if isinstance(value, Tensor):
        return value.copy_descriptor()
    if isinstance(value, Handle | Binding):
        return _whole(value)
    raise InvalidArgument(
        f"read: expected a Binding or Handle (or a Tensor), got {type(value).__name__}"
    )


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
        if any(not _is_int(d) or d < 0 for d in shape):
            raise InvalidArgument(
                f"shape={tuple(shape)!r} must hold ints >= 0 (one per dimension); "
                "e.g. (rows, cols), with numpy integers accepted"
            )
    for elem in seqs.get("elem_sizes", ()):
        if not _is_int(elem) or elem <= 0:
            raise InvalidArgument(f"elem_size must be a positive int, got {elem!r}")


def _items(method: str, name: str, value: Any) -> Sequence[Any]:
    """``value`` if it is a list-like of items, else InvalidArgument naming the argument
    (``client.read(h)`` instead of ``client.read([h])``)."""
    if isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray):
        return value
    raise InvalidArgument(
        f"{method}: {name} must be a list, got {type(value).__name__}; "
        f"e.g. client.{method}([...]) with one item per {name[:-1]}"
    )


_WRITE_FORM: Final = (
    "client.write([(handle.copy_descriptor(shape, strides, elem_size), data), ...]) "
    "(a Tensor stands for its own descriptor: client.write([(tensor, array)]))"
)


def _write_items(items: object, extra: tuple[object, ...]) -> Sequence[Any]:
    """``write``'s one argument as a list of ``(descriptor, data)`` pairs, or
    InvalidArgument showing the form (``client.write(h, data)``, ``write([desc])``)."""
    if extra:
        given = ", ".join(type(v).__name__ for v in (items, *extra))
        raise InvalidArgument(
            f"write: takes one argument, a list of (descriptor, data) pairs, but was given "
            f"{1 + len(extra)} ({given}); write {_WRITE_FORM}"
        )
    if not isinstance(items, Sequence) or isinstance(items, str | bytes | bytearray):
        raise InvalidArgument(
            f"write: items must be a list of (descriptor, data) pairs, got "
            f"{type(items).__name__}; write {_WRITE_FORM}"
        )
    for i, item in enumerate(items):
        if type(item) not in (tuple, list) or len(item) != 2:
            raise InvalidArgument(
                f"write: items[{i}] must be a (descriptor, data) pair, got "
                f"{type(item).__name__}; write {_WRITE_FORM}"
            )
        if isinstance(item[0], Handle | Binding):
            raise InvalidArgument(
                f"write: items[{i}][0] is a {type(item[0]).__name__}, not a descriptor of "
                "its layout; for its bytes as they are, "
                "(handle.copy_descriptor((handle.size,), (1,), 1), data)"
            )
    return items


def _foreign(method: str, binding: Binding | Handle) -> InvalidHandle:
    """The InvalidHandle of ``method`` given ``binding`` of another (or a closed) client."""
    return InvalidHandle(
        f"{method}: {binding!r} belongs to another client (or to a closed one); use "
        "handles only with the client that created them (client.to_client(handle, other) "
        "copies one across)"
    )


def _foreign_launch(owner: object, count: CubeCount, bindings: Bindings) -> None:
    """``execute``'s refusal at the call of a binding the server would only meet when
    the launch runs (failing it, and tainting its other buffers): a buffer, a tensor
    map's buffer or a dynamic count of another client. ``owner``: the token this
    client's handles carry. O(1) per binding."""
    for b in bindings.buffers:
        if b.memory.queue is not owner:
            raise _foreign("execute", b)
    for t in bindings.tensor_maps:
        if t.binding.memory.queue is not owner:
            raise _foreign("execute", t.binding)
    if count.binding is not None and count.binding.memory.queue is not owner:
        raise _foreign("execute", count.binding)


def _zero_count(kernel: Kernel, count: CubeCount) -> None:
    """A CHECKED launch of ``kernel`` over a static count with a zero dimension,
    refused at the call (every server refuses it, as a GPU does)."""
    problem = grid_problem((count.x, count.y, count.z), (2**32, 2**32, 2**32))
    raise InvalidArgument(f"execute: kernel {kernel.id!r}: {problem}")


def _bad_execute(kernel: object, count: object, bindings: object, mode: object) -> None:
    for name, value, cls in (
        ("kernel", kernel, Kernel),
        ("count", count, CubeCount),
        ("bindings", bindings, Bindings),
        ("mode", mode, ExecutionMode),
    ):
        if not isinstance(value, cls):
            raise InvalidArgument(f"execute: {name} must be a {cls.__name__}, got {value!r}")


def _same_as_tensor(tensor: Tensor, dtype: npt.DTypeLike | None, shape: ShapeLike) -> None:
    """``read_array`` of a Tensor: a ``dtype`` or ``shape`` given must be the tensor's."""
    if dtype is not None and _dtype("dtype", dtype) != tensor.dtype:
        raise InvalidArgument(
            f"read_array: dtype={np.dtype(dtype)} conflicts with the tensor's {tensor.dtype}; "
            "omit it, or read tensor.handle with that dtype"
        )
    if shape is not None and _dims("shape", shape) != tensor.shape:
        raise InvalidArgument(
            f"read_array: shape={tuple(shape)} conflicts with the tensor's {tensor.shape}; "
            "omit it, or reshape the array read"
        )


def _array_layout(
    source: object, dtype: npt.DTypeLike, shape: ShapeLike
) -> tuple[np.dtype[Any], tuple[int, ...] | None]:
    """``read_array`` of a buffer: its dtype and shape, checked against its size."""
    dt = _dtype("dtype", dtype)
    size = _whole(source).binding.size
    if size % dt.itemsize:
        raise InvalidArgument(
            f"read_array: the buffer's {size} bytes are not a whole number of dtype={dt} "
            f"elements ({dt.itemsize} bytes each); pass a dtype that divides the size"
        )
    if shape is None:
        return dt, None
    dims = _dims("shape", shape)
    if int(np.prod(dims)) * dt.itemsize != size:
        raise InvalidArgument(
            f"read_array: shape={dims} of {dt} needs {int(np.prod(dims)) * dt.itemsize} "
            f"bytes; the buffer has {size}"
        )
    return dt, dims


def _dtype(
    name: str, value: npt.DTypeLike, use: str = "a numeric or bool dtype such as np.float32"
) -> np.dtype[Any]:
    """``value`` as a numpy dtype of fixed-size plain data, or InvalidArgument naming it
    (and ``use``: what to give instead)."""
    try:
        dt = np.dtype(value)
    except TypeError as exc:
        raise InvalidArgument(
            f"{name}={value!r} is not a numpy dtype; use one such as np.float32 or 'int64'"
        ) from exc
    if dt.hasobject or dt.itemsize == 0:
        raise InvalidArgument(
            f"{name}={dt} is not plain fixed-size data (an object, or a flexible dtype of "
            f"no size); use {use}"
        )
    return dt


_SIZES: Final = {"b": (1,), "i": (1, 2, 4, 8), "u": (1, 2, 4, 8), "f": (2, 4, 8), "c": (8, 16)}
"""The item sizes of each kind a kernel computes on and DLPack exports (no longdouble)."""
SUPPORTED_DTYPES: Final = (
    "bool, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, float32, "
    "float64, complex64 or complex128, in native byte order"
)
"""The dtypes a tensor may have, as the refusals name them."""


def _numeric_dtype(name: str, value: npt.DTypeLike) -> np.dtype[Any]:
    """``value`` as a dtype a tensor may have (what a kernel computes on and DLPack
    exports: :data:`SUPPORTED_DTYPES`), or InvalidArgument naming it and them: strings,
    structured, datetimes, objects, ``longdouble`` and non-native byte orders (``>f4``)
    are refused."""
    dt = _dtype(name, value, f"one of {SUPPORTED_DTYPES}")
    if dt.kind not in _SIZES or dt.fields is not None or dt.subdtype is not None:
        raise InvalidArgument(
            f"{name}={dt} is not a numeric or bool dtype; use one of {SUPPORTED_DTYPES} "
            "(e.g. np.float32)"
        )
    if not dt.isnative:
        raise InvalidArgument(
            f"{name}={dt} is not in the machine's byte order, which kernels and "
            f"DLPack need; convert it (arr.astype(arr.dtype.newbyteorder('='))), or use "
            f"one of {SUPPORTED_DTYPES}"
        )
    if dt.itemsize not in _SIZES[dt.kind]:
        raise InvalidArgument(
            f"{name}={dt} ({dt.itemsize} bytes) is a dtype no kernel computes on and DLPack "
            f"cannot export; use one of {SUPPORTED_DTYPES} (e.g. .astype(np.float64))"
        )
    return dt


def _dims(name: str, shape: Sequence[int]) -> tuple[int, ...]:
    """``shape`` as a tuple of ints >= 0 (numpy integers accepted), or InvalidArgument."""
    try:
        dims = tuple(shape)
    except TypeError as exc:
        raise InvalidArgument(f"{name}={shape!r} must be a sequence of ints") from exc
    if not all(_is_int(d) and d >= 0 for d in dims):
        raise InvalidArgument(
            f"{name}={shape!r} must hold ints >= 0, one per dimension (numpy integers "
            "accepted); e.g. (rows, cols)"
        )
    return tuple(int(d) for d in dims)


def _is_int(value: object) -> bool:
    """True for ints and numpy integers (not bools)."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


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
