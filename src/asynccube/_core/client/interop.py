"""DLPack exchange between a client's tensors and other array libraries.

Export (``Tensor.__dlpack__``, ``__cuda_array_interface__``) is ordered after every
command sent before it, fire-and-forget ones included: the commands still queued for the
channel's actor are run first, inline (``Channel.run_queued_inline``), so that the
server has issued all of them. Where that would block (a queued command waits on a job
in a worker thread, such as a large staged copy), a CUDA export is ordered after them
on the device instead, through a gate the commands open once issued
(:mod:`..cuda.exports`), without blocking. Behind a kernel's first load (which
synchronizes the device, so a waiting consumer would hold it) and for a CPU consumer,
which has no stream, the export is refused with a :class:`DLPackError` naming the
reason.

On the host the tensor's memory is handed to the consumer without a copy, wrapped in an
array whose base holds the tensor's :class:`Handle` (so the pools never reuse the slice)
and the memory itself (the storage's page, or an imported producer's memory), so the
buffer stays valid as long as the consumer holds it, after ``client.close()`` too. The
server (``export_view``) waits, briefly, for the worker of the stream that last used
the buffer to finish the work queued on it; work still running after that (a long
kernel) is refused with a :class:`DLPackError` rather than the event loop being
blocked. The capsule itself (versioned when the consumer asks with ``max_version``) is
made by numpy's own DLPack export; numpy's ``BufferError`` becomes a DLPackError.

On CUDA the capsule is made here (:mod:`.dlpack`): the consumer's stream waits, on the
device, for asynccube's work on the buffer, and the capsule keeps the tensor's handle
and a lease (:mod:`..cuda.exports`) that keeps the device memory and the context past
``client.close()`` until the consumer's deleter runs.

Import (``client.from_dlpack(obj, device=, copy=)``): the capsule is consumed here
(:class:`.dlpack.Imported`: a legacy, unversioned capsule is writable, as its
producer's contract says), and the producer's memory is bound to a new handle
(``import_view``/``import_pointer``) without a copy, or a copy where the array API's
``copy`` asks for one; what is bound keeps the consumed capsule (whose deleter frees the
producer's memory) and ``obj`` alive while any handle, binding or queued task refers to
it, and the memory never enters the pools.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import DLPackError, InvalidArgument
from ..server.layout import contiguous_strides
from ..values.stream_id import StreamId
from .dlpack import Imported, dtype_code, make_capsule, take_capsule
from .views import TensorClient, TensorView

__all__ = [
    "cuda_array_interface",
    "KDL_CPU",
    "KDL_CUDA",
    "dlpack_device",
    "export_dlpack",
    "import_dlpack",
    "tensor_strides",
]

KDL_CPU = 1
KDL_CUDA = 2


def client_of(tensor: TensorView) -> TensorClient:
    """The client a tensor was made by, or InvalidArgument saying how to get one."""
    ref: weakref.ReferenceType[TensorClient] | None = tensor._client
    client = ref() if ref is not None else None
    if client is None:
        raise InvalidArgument(
            "this Tensor has no live client to export it from: make tensors with "
            "client.tensor(handle, shape, dtype), client.create_array(...) or "
            "client.from_dlpack(...), and keep the client open while exporting"
        )
    return client


def dlpack_device(tensor: TensorView) -> tuple[int, int]:
    """``(device type, index)`` as DLPack numbers them: kDLCPU 1, kDLCUDA 2."""
    return _client_device(client_of(tensor))


def _client_device(client: TensorClient) -> tuple[int, int]:
    """The DLPack device of ``client``, parsed once and kept on the client (every
    export and import asks for it; a client never changes device)."""
    device: tuple[int, int] | None = getattr(client, _DEVICE_ATTRIBUTE, None)
    if device is None:
        device = _device_tuple(client.device)
        try:
            setattr(client, _DEVICE_ATTRIBUTE, device)
        except AttributeError:  # a client without a __dict__: parsed again next time
            pass
    return device


_DEVICE_ATTRIBUTE = "_dlpack_device"


def _device_tuple(device: str) -> tuple[int, int]:
    known = _DEVICES.get(device)
    if known is None:
        kind, _, index = device.partition(":")
        cuda = kind == "cuda"
        known = _DEVICES[device] = (KDL_CUDA if cuda else KDL_CPU, int(index or 0) if cuda else 0)
    return known


_DEVICES: dict[str, tuple[int, int]] = {}
"""Device strings parsed by :func:`dlpack_device` (an export asks twice per tensor)."""


def export_dlpack(
    tensor: TensorView,
    stream: Any,
    max_version: Any,
    dl_device: Any,
    copy: Any,
) -> Any:
    """A DLPack capsule over ``tensor``'s memory (see the module docstring)."""
    client = client_of(tensor)
    client._channel.check()
    device = _client_device(client)
    _check_request(device, stream, max_version, dl_device, copy)
    if device[0] == KDL_CUDA:
        return _export_cuda(client, tensor, device, stream, max_version, copy)
    _run_queued(client)
    exporter = getattr(client._server, "export_view", None)
    if exporter is None:
        raise DLPackError(f"DLPack export is not supported on {client.device}")
    view = exporter(tensor.binding(), StreamId.current())
    array = _exported_array(tensor, view)
    kwargs: dict[str, Any] = {"copy": copy} if copy is not None else {}
    if max_version is not None:
        kwargs["max_version"] = tuple(max_version)
    try:
        return array.__dlpack__(**kwargs)
    except (BufferError, TypeError, ValueError) as exc:  # numpy's, typed as the docs say
        raise DLPackError(f"cannot export {tensor!r} through DLPack: {exc}") from exc


def cuda_array_interface(tensor: TensorView) -> dict[str, Any]:
    """``__cuda_array_interface__`` v3 of a tensor on a CUDA client: its address, and
    as ``stream`` the CUDA stream after whose queued work the data is complete (the
    consumer orders its own work after that stream). AttributeError elsewhere, so that
    ``hasattr`` is False for tensors in host memory. Commands still queued behind a
    worker-thread job (a staged copy; not a kernel's first load, refused) are ordered
    before it through a gate (the stream given is the server's export stream, waiting on
    the device for it)."""
    client = client_of(tensor)
    exporter = getattr(client._server, "export_pointer", None)
    if exporter is None:
        raise AttributeError(
            f"__cuda_array_interface__: the tensor lives on {client.device}, not on a GPU"
        )
    client._channel.check()
    if tensor.nbytes_spanned() > tensor.handle.size:
        raise InvalidArgument(f"{tensor!r} addresses more bytes than its buffer holds")
    server: Any = client._server
    if client._channel.run_queued_inline() is None:
        ptr, stream = exporter(tensor.binding(), StreamId.current())
    else:
        ptr, stream, gate = server.pointer_gated(tensor.binding())
        _send_gate(client, gate, tensor)
    itemsize = tensor.dtype.itemsize
    return {
        "version": 3,
        "shape": tensor.shape,
        "typestr": tensor.dtype.str,
        "data": (ptr, False),
        "strides": tuple(s * itemsize for s in tensor.strides),
        "stream": stream or 2,  # 0 is not allowed; 2: the per-thread default stream
    }


def _export_cuda(
    client: TensorClient,
    tensor: TensorView,
    device: tuple[int, int],
    stream: Any,
    max_version: Any,
    copy: Any,
) -> Any:
    """A kDLCUDA capsule; the consumer's ``stream`` waits on the device for asynccube's
    work on the buffer (None: the legacy default stream, 1; -1: no ordering), commands
    still queued in the channel included: where they wait behind a worker-thread job
    (a staged copy; not a kernel's first load, refused) the consumer's stream waits on
    a gate they open (:mod:`..cuda.exports`). The capsule holds the handle and a lease
    that keeps the memory, and the context, past ``client.close()`` until the
    consumer's deleter."""
    if copy is True:
        raise DLPackError(
            "copy=True: asynccube shares, never copies, on export; read the tensor with "
            "`await client.read_array(tensor)` for a copy"
        )
    if stream == 0 or isinstance(stream, bool) or not (stream is None or isinstance(stream, int)):
        raise DLPackError(
            f"__dlpack__(stream={stream!r}): on CUDA give a stream handle (an int), 1 for "
            "the legacy default stream, 2 for the per-thread one, or -1 for no ordering"
        )
    if tensor.nbytes_spanned() > tensor.handle.size:
        raise InvalidArgument(f"{tensor!r} addresses more bytes than its buffer holds")
    consumer = None if stream == -1 else (1 if stream is None else stream)
    server: Any = client._server
    binding = tensor.binding()
    fast = getattr(client, "_fast", None) if server.one_call_export else None
    address = None
    if fast is not None and consumer is not None:  # the ordering in one call (cuda/fast.py)
        server.check_consumer(consumer)
        address = fast.export(binding, consumer, server.export_event())
    if address is not None:
        lease = server.export_lease(binding)
    elif client._channel.run_queued_inline() is None:
        address, lease = server.export_to_stream(binding, StreamId.current(), consumer)
    else:
        address, lease, gate = server.export_gated(binding, consumer)
        if gate is not None:
            _send_gate(client, gate, tensor)
    versioned = max_version is not None and max_version[0] >= 1
    return make_capsule(
        address, device, tensor.shape, tensor.strides, tensor.dtype, (tensor.handle, lease),
        versioned=versioned,
    )  # fmt: skip


def _send_gate(client: TensorClient, gate: Any, tensor: TensorView) -> None:
    """Queue the command that opens ``gate`` after the commands queued so far (fired:
    a driver error is held for the calling task's stream; the gate then opens from
    the host, so no consumer waits forever)."""
    channel, server = client._channel, client._server
    opener = server.open_gate  # type: ignore[attr-defined]
    channel.send(channel.fire, StreamId.current(), opener, gate, tensor.binding())


def _run_queued(client: TensorClient) -> None:
    """Issue every command sent before a host export (see the module docstring), or a
    DLPackError saying why that cannot be done without blocking the event loop: a CPU
    consumer has no stream to be ordered after them."""
    why = client._channel.run_queued_inline()
    if why is not None:
        raise DLPackError(
            f"cannot export this tensor now: {why}, and a CPU consumer (it has no "
            "stream) cannot be ordered after it without blocking the event loop; "
            "`await client.sync()` first, then export"
        )


def _check_request(
    device: tuple[int, int], stream: Any, max_version: Any, dl_device: Any, copy: Any
) -> None:
    if device[0] == KDL_CPU and stream is not None:
        raise DLPackError(
            f"__dlpack__(stream={stream!r}) on a CPU tensor: CPU memory has no streams, "
            "pass stream=None"
        )
    if max_version is not None and not _is_version(max_version):
        raise DLPackError(
            f"max_version must be a (major, minor) tuple of ints, got {max_version!r}"
        )
    if dl_device is not None and not _is_device(dl_device):
        raise DLPackError(
            f"dl_device must be a (device type, index) tuple of ints, got {dl_device!r}"
        )
    if dl_device is not None and dl_device != device:
        raise DLPackError(
            f"dl_device={dl_device!r} asks for another device than the tensor's "
            f"{device!r}; read it with `await client.read_array(tensor)` to get a copy"
        )
    if copy is not None and copy is not True and copy is not False:
        raise DLPackError(f"copy must be None, True or False, got {copy!r}")


def _is_device(value: Any) -> bool:
    """A DLPack device: a ``(device type, index)`` tuple of ints (bools refused)."""
    return (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )


def _is_version(value: Any) -> bool:
    if type(value) is tuple and len(value) == 2 and type(value[0]) is int is type(value[1]):
        return bool(value[0] >= 0 and value[1] >= 0)  # the common case, checked quickly
    return (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    )


def _exported_array(tensor: TensorView, view: npt.NDArray[np.uint8]) -> npt.NDArray[Any]:
    """A numpy array over the tensor's bytes (a :class:`_Held`) that keeps the
    tensor's handle (so the pools never hand its slice to another buffer) and the
    memory itself (``view``, its base: the storage's page, or an imported producer's
    memory) alive while the consumer holds it, whatever the client does: closing it
    frees its pages, but not one an export still holds."""
    dtype = tensor.dtype
    dtype_code(dtype)  # DLPackError for a dtype DLPack cannot express
    needed = tensor.nbytes_spanned()
    if needed > view.nbytes:
        raise InvalidArgument(
            f"{tensor!r} addresses {needed} bytes but its buffer holds {view.nbytes}"
        )
    itemsize = dtype.itemsize
    strides = tuple([s * itemsize for s in tensor.strides])
    held = np.ndarray.__new__(_Held, tensor.shape, dtype, buffer=view, strides=strides)
    held.handle = tensor.handle
    return held


class _Held(np.ndarray[Any, np.dtype[Any]]):
    """The array a host export hands out: its base is the memory, and it holds the
    tensor's handle (``handle``). A subclass, so that numpy never collapses it out of
    a consumer's chain of bases (an attribute on it costs less than a ctypes buffer
    over the same address)."""

    handle: Any


def tensor_strides(shape: Sequence[int], strides: Sequence[int] | None) -> tuple[int, ...]:
    """``strides`` checked against ``shape`` (ints >= 0, one per dimension), or the
    C-contiguous strides of ``shape`` (in elements) when None."""
    dims = _ints("shape", shape)
    if strides is None:
        return contiguous_strides(dims)
    given = _ints("strides", strides)
    if len(given) != len(dims):
        raise InvalidArgument(
            f"strides {given} and shape {dims} differ in length; give one stride per "
            "dimension, in elements"
        )
    return given


def _ints(name: str, values: Sequence[int]) -> tuple[int, ...]:
    try:
        items = tuple(values)
    except TypeError:
        raise InvalidArgument(f"{name} must be a sequence of ints, got {values!r}") from None
    if not all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in items):
        raise InvalidArgument(f"{name} must be a sequence of ints, got {values!r}")
    if any(v < 0 for v in items):
        raise InvalidArgument(f"{name} must hold ints >= 0, got {items}")
    return tuple(int(v) for v in items)


def import_dlpack(
    client: TensorClient, obj: Any, device: Any = None, copy: Any = None
) -> tuple[Any, tuple[int, ...], np.dtype[Any]]:
    """Bind ``obj``'s memory to a new handle; return the handle, shape and dtype.

    ``copy`` (the array API's): False shares the producer's memory or raises; True
    binds a copy made now; None shares where it can and copies where it cannot
    (read-only or non-contiguous memory). ``device``: None, or this client's device
    (its string, or its DLPack ``(type, index)``). What is bound keeps the consumed
    capsule (so the producer's memory) and ``obj`` alive while the memory is in use."""
    client._channel.check()
    ours = _client_device(client)
    if copy is not None or device is not None:
        _check_import_request(client, ours, device, copy)
    if ours[0] == KDL_CUDA:
        return _import_cuda(client, ours[1], obj, copy)
    importer = getattr(client._server, "import_view", None)
    if importer is None:
        raise DLPackError(f"DLPack import is not supported on {client.device}")
    flat, shape, dtype = _host_memory(obj, copy)
    stream = StreamId.current()
    handle = client._server.new_handle(flat.nbytes, stream)
    client._channel.send(_bind, importer, handle, flat, stream)
    return handle, shape, dtype


def _check_import_request(
    client: TensorClient, ours: tuple[int, int], device: Any, copy: Any
) -> None:
    """DLPackError for a ``copy`` other than None/True/False, or a ``device`` other
    than this client's (``ours``: its DLPack device)."""
    if copy is not None and copy is not True and copy is not False:
        raise DLPackError(f"from_dlpack(copy={copy!r}): copy must be None, True or False")
    if device is not None and not isinstance(device, str) and not _is_device(device):
        raise DLPackError(
            f"from_dlpack(device={device!r}): give None, a device string ({client.device!r}) "
            "or a DLPack (device type, index) tuple of ints"
        )
    if device is None or device == client.device:
        return
    if client.device == "host" and device == "cpu":
        return
    if device == ours:  # a DLPack (type, index) tuple, checked above
        return
    raise DLPackError(
        f"from_dlpack(device={device!r}): this client makes tensors on {client.device} "
        f"(DLPack device {ours}); pass device=None or {client.device!r}, or import into "
        "a client of that device"
    )


def _import_cuda(
    client: TensorClient, index: int, obj: Any, copy: Any
) -> tuple[Any, tuple[int, ...], np.dtype[Any]]:
    """A CUDA producer's memory: its work ordered before this task's stream, then
    bound to a handle that keeps the consumed capsule (and ``obj``) until the device has
    passed asynccube's last use. A copy (``copy=True``, or None where the memory cannot
    be shared): see :func:`_import_cuda_copy` (``index``: the client's device).

    The producer is asked for the legacy default stream (``__dlpack__(stream=1)``),
    and this task's stream waits on the device for that one (:meth:`after_legacy`):
    torch and CuPy on their default stream then order nothing themselves (measured on
    an H200, torch's ``__dlpack__`` given asynccube's stream costs 15.7 µs, its own
    event and wait made through Python), and a producer on a stream of its own orders
    its work before the legacy stream, so before this task's stream."""
    device = _device_of(obj)
    if device != (KDL_CUDA, index):
        raise DLPackError(
            f"{type(obj).__name__} lives on DLPack device {device!r}, not on this "
            f"client's {client.device} (kDLCUDA, {index}); import it into a client there"
        )
    server: Any = client._server
    stream = StreamId.current()
    if copy is True:
        return _import_cuda_copy(client, obj, stream)
    imported = _take(obj, 1, copy)
    why = _unshareable(obj, imported)
    if why is not None and copy is None:
        del imported  # its deleter runs: the producer may free what it lent
        return _import_cuda_copy(client, obj, stream)
    if why is not None:
        raise DLPackError(why + ("" if copy is not False else _NO_COPY))
    server.activate()
    server.after_legacy(stream)
    return _bind_imported(client, server.import_pointer, imported, stream)


def _import_cuda_copy(
    client: TensorClient, obj: Any, stream: StreamId
) -> tuple[Any, tuple[int, ...], np.dtype[Any]]:
    """``copy=True`` on CUDA: the producer's own copy (``__dlpack__(copy=True)``);
    where it makes none on the device (CuPy copies to the host only) and the memory
    is contiguous, a device copy made at the call (:meth:`import_copied`: ordered
    after the producer's earlier work, before its later work on blocking streams).
    With the channel busy behind a worker-thread job the copy is queued instead, and
    only the producer's earlier work is ordered before it."""
    server: Any = client._server
    try:
        imported = _take(obj, server.stream_handle(stream), True)
    except DLPackError as exc:
        if not isinstance(exc.__cause__, BufferError):
            raise
        return _copy_on_device(client, obj, stream)
    why = _unshareable(obj, imported)
    if why is not None:
        raise DLPackError(why)
    return _bind_imported(client, server.import_pointer, imported, stream)


def _copy_on_device(
    client: TensorClient, obj: Any, stream: StreamId
) -> tuple[Any, tuple[int, ...], np.dtype[Any]]:
    """``copy=True`` where the producer copies to the host only (see above)."""
    server: Any = client._server
    imported = _take(obj, 1, None)  # the producer's work ordered before the legacy stream
    _unshareable(obj, imported)  # a dtype no tensor can have is refused
    if imported.strides != contiguous_strides(imported.shape) and 0 not in imported.shape:
        raise DLPackError(
            f"{type(obj).__name__} is not C-contiguous and its producer copies only to "
            "the host (copy=True): import a contiguous one (e.g. .copy() first)"
        )
    if client._channel.run_queued_inline() is not None:
        return _bind_imported(client, server.import_copied, imported, stream)
    assert imported.dtype is not None
    nbytes = math.prod(imported.shape) * imported.dtype.itemsize
    handle = server.new_handle(nbytes, stream)
    server.activate()
    server.import_copied(handle, imported.address, nbytes, imported, stream)
    return handle, imported.shape, imported.dtype


def _bind_imported(
    client: TensorClient, importer: Any, imported: Imported, stream: StreamId
) -> tuple[Any, tuple[int, ...], np.dtype[Any]]:
    """A new handle, bound on the actor by ``importer`` to ``imported``'s memory."""
    assert imported.dtype is not None
    nbytes = math.prod(imported.shape) * imported.dtype.itemsize
    handle = client._server.new_handle(nbytes, stream)
    client._channel.send(_bind_cuda, importer, handle, imported, nbytes, stream)
    return handle, imported.shape, imported.dtype


_NO_COPY = "; or pass copy=None (or True) to import a copy"


def _take(obj: Any, stream: int | None, copy: Any) -> Imported:
    """:func:`take_capsule`, its failures as DLPackError."""
    name = type(obj).__name__
    try:
        return take_capsule(obj, stream, copy)
    except DLPackError:
        raise
    except TypeError as exc:
        if copy is not None:
            raise DLPackError(
                f"{name}.__dlpack__ takes no copy= (a producer of DLPack < 1.0), so it "
                f"cannot be asked for a copy ({exc}); import it with copy=None"
            ) from exc
        raise DLPackError(f"cannot import {name} through DLPack: {exc}") from exc
    except (BufferError, RuntimeError, ValueError) as exc:
        raise DLPackError(f"cannot import {name} through DLPack: {exc}") from exc


def _unshareable(obj: Any, imported: Imported) -> str | None:
    """Why asynccube cannot work on the memory ``imported`` describes in place (None:
    it can); a dtype no tensor can have is refused at once."""
    if imported.dtype is None:
        raise DLPackError(f"{type(obj).__name__}: DLPack dtype (code, bits, lanes) "
                          f"{imported.type_code} cannot be expressed in a Tensor")  # fmt: skip
    if imported.read_only:
        return f"{type(obj).__name__} is read-only; asynccube kernels may write to any buffer"
    shape, strides = imported.shape, imported.strides
    if len(shape) == 1 and strides == (1,):  # the common case, seen at once
        return None
    if strides != contiguous_strides(shape) and 0 not in shape:
        return (
            f"{type(obj).__name__} is not C-contiguous (strides {strides} for shape "
            f"{shape}); import a contiguous one (e.g. .contiguous())"
        )
    return None


def _bind_cuda(importer: Any, handle: Any, imported: Imported, nbytes: int, stream: Any) -> None:
    importer(handle, imported.address, nbytes, imported, stream)


class _Imported:
    """The bytes of an imported copy, as a flat ``uint8`` array's base: it keeps
    ``array`` alive while any handle, binding or queued task refers to it (shared
    memory is bound through :meth:`.dlpack.Imported.flat`, whose base keeps the
    consumed capsule, so the producer's memory, and the producer object)."""

    __slots__ = ("__array_interface__", "array")

    def __init__(self, array: npt.NDArray[Any]) -> None:
        self.array = array
        self.__array_interface__ = {
            "version": 3,
            "shape": (array.nbytes,),
            "typestr": "|u1",
            "data": (array.__array_interface__["data"][0], False),
        }


def _bind(importer: Any, handle: Any, flat: npt.NDArray[np.uint8], stream: StreamId) -> None:
    importer(handle, flat, stream)


def _host_memory(obj: Any, copy: Any) -> tuple[npt.NDArray[np.uint8], tuple[int, ...], Any]:
    """``obj``'s memory as the flat bytes of a C-contiguous, writable array, with its
    shape and dtype: its own (kept alive through the consumed capsule), or a copy made
    now where ``copy`` asks for one (or is None and the memory is read-only or not
    contiguous); else a DLPackError naming what stands in the way. A legacy
    (unversioned) capsule carries no read-only flag, and its producer's contract is
    that the memory may be written: it is shared."""
    device = _device_of(obj)
    if device[0] != KDL_CPU:
        raise DLPackError(
            f"{type(obj).__name__} lives on DLPack device {device!r}, not on this "
            "client's host memory (kDLCPU, 1); import it into a client on that device"
        )
    imported = _take(obj, None, None)
    why = _unshareable(obj, imported)
    dtype = imported.dtype
    assert dtype is not None
    if copy is True or (copy is None and why is not None):
        array = np.array(imported.array(), order="C", copy=True)  # owned by numpy
        return np.asarray(_Imported(array)), array.shape, dtype
    if why is not None:
        raise DLPackError(why + _NO_COPY)
    shape = imported.shape
    return imported.flat(math.prod(shape) * dtype.itemsize), shape, dtype


def _device_of(obj: Any) -> tuple[int, int]:
    method = getattr(obj, "__dlpack_device__", None)
    if method is None or not hasattr(obj, "__dlpack__"):
        raise DLPackError(
            f"{type(obj).__name__} does not implement the DLPack protocol "
            "(__dlpack__ and __dlpack_device__)"
        )
    kind, index = method()
    return int(kind), int(index)
