"""``client.wait(obj)`` and ``client.after(obj)``: another library's GPU work, awaited
without blocking the loop, or ordered before the calling task's stream on the device.

``obj`` is turned into a :class:`~..server.foreign.ForeignWork` here (:func:`describe`),
without importing any library: by the cuda.core protocol (``__cuda_stream__``, which
torch, CuPy and ``cuda.bindings``' ``CUstream`` implement in their recent versions), by
the attributes torch and CuPy have long exposed (``cuda_stream``/``cuda_event``,
``ptr``), by ``cuda.bindings``' handle types, or as a raw stream handle (an ``int``).
At the call, the server checks it and captures the work queued on it so far
(``capture_foreign``: an event of its own recorded now, so neither a command waiting
in the channel's queue nor a re-recorded event moves what is waited for); bad input
(another device, a handle the driver reports as invalid; on the host server, every one) raises
:class:`~asynccube.ForeignStreamError` before anything is queued. Then:

* ``wait`` is an awaited command, like ``sync``: its future settles through the channel's
  completion watcher once the work is done (and raises the errors held for the calling
  task's stream first, as every awaited call does). Cancelling the awaiting task leaves
  the completion to finish in the background, as a read's does, and frees it then. On
  CUDA, work done within a few µs is first offered to the server's one-call route
  (``FastSync.foreign``, on a sync's conditions), which settles the future at once.
* ``after`` is fire-and-forget, ordered like an ``execute`` of the calling task; an error
  the driver reports when it runs is held for the task's stream.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from ..channel.channel import Channel
from ..errors import ForeignStreamError
from ..server.foreign import ForeignWork, Kind
from ..server.protocol import ComputeServer
from .dispatch import Dispatch

__all__ = ["ForeignClient", "after", "describe", "wait"]

_ACCEPTED = (
    "a CUDA stream or event: an object with __cuda_stream__ (cuda.core's protocol), a "
    "torch.cuda.Stream or torch.cuda.Event, a cupy.cuda.Stream or cupy.cuda.Event, a "
    "cuda.bindings CUstream or CUevent, or a raw stream handle (an int)"
)


class ForeignClient(Protocol):
    """What these calls need of a client (the client imports this module)."""

    _server: ComputeServer
    _channel: Channel
    _dispatch: Dispatch
    _fast_sync: Any


_HANDLE_TYPES = {
    "CUstream": "stream",
    "cudaStream_t": "stream",
    "CUevent": "event",
    "cudaEvent_t": "event",
}


def wait(client: ForeignClient, obj: Any) -> asyncio.Future[None]:
    """``client.wait(obj)`` (see the module docstring)."""
    client._channel.check()  # a graph capture's guard names "wait" and refuses it
    work = describe(obj, "wait")
    server = client._server
    _capture(client, work)
    fast = client._fast_sync  # CUDA: cuda/fast_sync.py, the work done within a few µs
    if fast is not None:
        done = fast.foreign(work)
        if done is not None:
            return done  # type: ignore[no-any-return]
    return client._dispatch.request(server.foreign_wait, work)


def after(client: ForeignClient, obj: Any) -> None:
    """``client.after(obj)`` (see the module docstring)."""
    client._channel.check()
    work = describe(obj, "after")
    server = client._server
    _capture(client, work)
    client._dispatch.fire(server.foreign_after, work)


def _capture(client: ForeignClient, work: ForeignWork) -> None:
    """The server's ``capture_foreign``, now, with its device current (another client's
    commands may have left another one current on this thread)."""
    client._channel.activate()
    client._server.capture_foreign(work)


def describe(obj: Any, call: str) -> ForeignWork:
    """What ``obj`` stands for: a stream or an event, and its raw handle; or
    ForeignStreamError naming it (``call``: the client method, for the message)."""
    cls = type(obj)
    if cls is int:
        return _raw(obj, call)
    origin = _ORIGINS.get(cls)
    if origin is None:
        origin = _ORIGINS[cls] = _origin(cls)
    root, name, declared = origin
    if root == "torch":
        if declared == "event" or (not declared and hasattr(obj, "cuda_event")):
            return _torch(obj, "event", obj.cuda_event, name, call)
        if declared == "stream" or hasattr(obj, "cuda_stream"):
            return _torch(obj, "stream", obj.cuda_stream, name, call)
    if hasattr(obj, "__cuda_stream__"):
        return _protocol(obj, name, call)
    if root == "cupy" and hasattr(obj, "ptr"):
        kind: Kind = "event" if "Event" in cls.__name__ else "stream"
        device = getattr(obj, "device_id", None)
        known = device if isinstance(device, int) and device >= 0 else None
        return _labelled(kind, obj.ptr, name, call, known)
    if root == "cuda" and cls.__name__ in _HANDLE_TYPES:
        kind = "event" if _HANDLE_TYPES[cls.__name__] == "event" else "stream"
        return _labelled(kind, int(obj), name, call, None)
    if isinstance(obj, int) and not isinstance(obj, bool):  # an int subclass
        return _raw(obj, call)
    raise ForeignStreamError(f"client.{call}() takes {_ACCEPTED}; got {name}: {obj!r:.80}")


_ORIGINS: dict[type, tuple[str, str, str]] = {}
"""Type -> (its top-level package, its qualified name, the handle a torch class declares:
``"event"``, ``"stream"``, or ``""``): a cache for ``describe``."""


def _origin(cls: type) -> tuple[str, str, str]:
    module = cls.__module__ or ""
    root = module.partition(".")[0]
    declared = ""  # none: each object is asked (a handle set on the instance)
    if root == "torch":  # torch's types declare their handle, a property: asked once
        if hasattr(cls, "cuda_event"):
            declared = "event"
        elif hasattr(cls, "cuda_stream"):
            declared = "stream"
    return root, f"{module}.{cls.__qualname__}", declared


def _protocol(obj: Any, name: str, call: str) -> ForeignWork:
    """The cuda.core protocol: ``__cuda_stream__()`` returns ``(0, handle)``."""
    attr = obj.__cuda_stream__
    try:
        value = attr() if callable(attr) else attr
    except Exception as exc:
        raise ForeignStreamError(
            f"client.{call}({name}): its __cuda_stream__() raised {exc!r}"
        ) from exc
    ok = isinstance(value, tuple) and len(value) == 2
    if not ok or value[0] != 0 or not isinstance(value[1], int) or isinstance(value[1], bool):
        raise ForeignStreamError(
            f"client.{call}({name}): __cuda_stream__() must return (0, handle) with an int "
            f"handle (version 0 of cuda.core's protocol); it returned {value!r:.80}"
        )
    return _labelled("stream", value[1], name, call, _torch_device(obj, name, call))


def _raw(obj: int, call: str) -> ForeignWork:
    return ForeignWork("stream", _handle(obj, call, repr(obj)), "stream handle", call)


def _torch(obj: Any, kind: Kind, raw: Any, name: str, call: str) -> ForeignWork:
    """A torch stream or event: in this one frame where its handle and device are good
    (``client.wait(torch_stream)``'s common case), else through the checks that name
    what is wrong."""
    device = getattr(obj, "device", None)
    if (
        type(raw) is int
        and 0 <= raw < 1 << 64
        and (device is None or getattr(device, "type", "cuda") == "cuda")
    ):
        index = None if device is None else getattr(device, "index", None)
        return ForeignWork(kind, raw, name, call, index if isinstance(index, int) else None)
    return _labelled(kind, raw, name, call, _torch_device(obj, name, call))


def _torch_device(obj: Any, name: str, call: str) -> int | None:
    """The CUDA device a torch stream or event declares (None: none declared yet, as an
    event never recorded; or not a torch object)."""
    if not name.startswith("torch."):
        return None
    device = getattr(obj, "device", None)
    if device is None:
        return None
    kind = getattr(device, "type", "cuda")
    if kind != "cuda":
        raise ForeignStreamError(f"client.{call}({name}): it is a {kind} stream, not a CUDA one")
    index = getattr(device, "index", None)
    return index if isinstance(index, int) else None


def _labelled(kind: Kind, raw: Any, name: str, call: str, device: int | None) -> ForeignWork:
    return ForeignWork(kind, _handle(raw, call, name), name, call, device)


def _handle(raw: Any, call: str, name: str) -> int:
    """``raw`` as a driver handle: an int in [0, 2**64)."""
    if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < 1 << 64:
        return raw
    raise ForeignStreamError(
        f"client.{call}({name}): a CUDA handle is an int in [0, 2**64), got {raw!r:.80}"
    )
