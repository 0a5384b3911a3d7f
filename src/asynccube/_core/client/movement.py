"""The data-movement part of a client: data snapshotted (or handed over, from staging
buffers) on its way to the server, writes and reads in stream order, the server's
prepare hooks that stage large transfers in a worker thread first, and the storage
behind a binding. ``ComputeClient.create`` and ``read`` (the hot path) send their
commands themselves and use this part's actor-side halves."""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..channel.channel import Channel
from ..errors import InvalidArgument, LaunchDropped
from ..server.protocol import BindingResource, ComputeServer
from ..values.stream_id import StreamId
from ..values.types import Binding, CopyDescriptor, Handle
from .args import (
    DataLike,
    _descriptor,
    _foreign,
    _forget_staging,
    _is_int,
    _items,
    _whole,
    _write_items,
    as_bytes,
)
from .dispatch import Dispatch, Job
from .jobs import JobThread

__all__ = ["DataMovement", "writable_bytes"]


class DataMovement:
    """Writes, reads, staging buffers and snapshots of one client (see above). A method
    that checks the channel has the name of the client's method it serves (a graph
    capture's guard names the command after its caller)."""

    def __init__(
        self, server: ComputeServer, channel: Channel, dispatch: Dispatch, jobs: JobThread
    ) -> None:
        self._server = server
        self._channel = channel
        self._dispatch = dispatch
        self._jobs = jobs
        # Optional server hooks: blocking work (staging, pinning memory) that the actor
        # runs in a worker thread before the command, never on the loop.
        self._prepare_write: Callable[..., Job | None] | None = getattr(
            server, "prepare_write", None
        )
        self._prepare_read: Callable[..., Job | None] | None = getattr(server, "prepare_read", None)
        # Optional (:mod:`..server.preparation`): staging for the reads a warm-up drops.
        self._warm_read: Callable[[list[CopyDescriptor]], None] | None = getattr(
            server, "warm_up_read", None
        )
        # Optional: a server-side snapshot of large data (CUDA: straight into pinned memory).
        self._server_snapshot: Callable[[Any], Any] | None = getattr(server, "snapshot", None)
        self._staging: dict[int, weakref.ref[npt.NDArray[np.uint8]]] = {}
        # The token this server's handles carry: a write into another client's buffer
        # is refused at the call (None: a server without one, unchecked).
        self._owner: object = getattr(server, "handle_owner", None)

    # -- host data on its way in --------------------------------------------------------

    async def staging(self, sizes: Sequence[int]) -> list[npt.NDArray[np.uint8]]:
        """See :meth:`ComputeClient.staging`."""
        self._channel.check()
        for n in _items("staging", "sizes", sizes):
            if not _is_int(n) or n < 0:
                raise InvalidArgument(f"staging sizes must be ints >= 0, got {n!r}")
        ints = [int(n) for n in sizes]
        stream = StreamId.current()
        views = await self._jobs.run(lambda: self._server.staging(ints, stream))
        arrays = [np.asarray(v, dtype=np.uint8).reshape(-1) for v in views]
        for array in arrays:
            forget = functools.partial(_forget_staging, self._staging, id(array))
            self._staging[id(array)] = weakref.ref(array, forget)
        return arrays

    def snapshot(self, data: Any) -> Any:
        """``data`` as bytes to hand to the server: staging buffers as they are, anything
        mutable copied now."""
        if type(data) is np.ndarray:
            ref = self._staging.get(id(data))
            if ref is not None and ref() is data:
                return memoryview(data)  # type: ignore[arg-type]
        if self._server_snapshot is not None and not isinstance(data, bytes):
            snap = self._server_snapshot(data)
            if snap is not None:
                return snap
        return as_bytes(data)

    # -- writes -------------------------------------------------------------------------

    def write(self, items: Sequence[tuple[CopyDescriptor, DataLike]], *extra: object) -> None:
        """See :meth:`ComputeClient.write`."""
        self._channel.check()
        copies = [(_descriptor(d), self.snapshot(data)) for d, data in _write_items(items, extra)]
        owner = self._owner
        if owner is not None:
            for desc, _ in copies:
                if desc.binding.memory.queue is not owner:
                    raise _foreign("write", desc.binding)
        mids = [d.binding.memory.id for d, _ in copies]
        self._channel.send_tracked(self.write_on_actor, mids, StreamId.current(), copies)

    def write_on_actor(self, stream: StreamId, copies: list[tuple[CopyDescriptor, Any]]) -> Any:
        """The actor's half of a write: staged first where the server asks."""
        job = self._prepare_write(copies, stream) if self._prepare_write is not None else None
        fire, written = self._channel.fire_writing, [d.binding for d, _ in copies]
        if job is not None:
            after = self._dispatch.after
            return after(job, stream, fire, stream, written, self._server.write, copies)
        fire(stream, written, self._server.write, copies)
        return None

    def create_with_data(self, stream: StreamId, handle: Handle, raw: Any) -> Any:
        """The actor's half of ``create`` (and of a staged ``to_client``): the buffer
        made and filled in one server call."""
        fire, create = self._channel.fire_writing, self._server.create_with_data
        written = [handle]
        if self._prepare_write is not None:
            size = handle.buffer_size
            job = self._prepare_write([(handle.copy_descriptor((size,), (1,), 1), raw)], stream)
            if job is not None:
                after = self._dispatch.after
                return after(job, stream, fire, stream, written, create, handle, raw)
        fire(stream, written, create, handle, raw)
        return None

    # -- reads --------------------------------------------------------------------------

    def read_tensor(self, descriptors: Sequence[CopyDescriptor]) -> asyncio.Future[list[bytes]]:
        """See :meth:`ComputeClient.read_tensor`."""
        self._channel.check()
        descs = [_descriptor(d) for d in _items("read_tensor", "descriptors", descriptors)]
        mids = [d.binding.memory.id for d in descs]
        return self._channel.request_tracked(self.read_on_actor, mids, StreamId.current(), descs)

    def read_arrays(self, descs: list[CopyDescriptor]) -> asyncio.Future[list[Any]] | None:
        """Like :meth:`read_tensor` (the caller checked the channel), each result a new
        writable uint8 array the caller owns, where the server makes them (the host's
        ``read_arrays``: no copy on the loop); None where it does not."""
        reader = getattr(self._server, "read_arrays", None)
        if reader is None:
            return None
        read = functools.partial(self.read_on_actor, reader=reader)
        mids = [d.binding.memory.id for d in descs]
        return self._channel.request_tracked(read, mids, StreamId.current(), descs)

    def read_into(self, desc: CopyDescriptor, out: Any) -> asyncio.Future[None]:
        """See :meth:`ComputeClient.read_into` (the caller made ``desc``)."""
        self._channel.check()
        target = writable_bytes(out, desc.nbytes)
        server = self._server
        read = functools.partial(_read_into, server.read_into, [target])
        prepare = getattr(server, "prepare_read_into", None)  # else a read's own hook
        ready = self._prepare_read if prepare is None else functools.partial(prepare, outs=[target])
        on_actor = functools.partial(self.read_on_actor, reader=read, prepare=ready)
        # tracked, as read_tensor is: queued, it leaves the other streams' commands free
        # to run ahead (the one-call routes), where an untracked one would stop them all
        mids = [desc.binding.memory.id]
        return self._channel.request_tracked(on_actor, mids, StreamId.current(), [desc])

    def read_on_actor(
        self,
        stream: StreamId,
        descs: list[CopyDescriptor],
        fut: Any,
        reader: Callable[..., Any] | None = None,
        prepare: Callable[..., Any] | None = None,
    ) -> Any:
        """The actor's half of a read: refused at once where a buffer is tainted (CUDA),
        else staged where the server asks, then read once the stream's work is done."""
        channel = self._channel
        if channel._clears_at_call and channel._held._tainted:  # CUDA: checked when issued
            error = channel._held.check([d.binding.memory.id for d in descs])
            if error is not None:
                if isinstance(error, LaunchDropped) and self._warm_read is not None:
                    self._warm_read(descs)  # a warm-up pass's read: staging for its size
                channel.refuse(fut, stream, error)
                return None
        prepare = self._prepare_read if prepare is None else prepare
        job = prepare(descs, stream=stream) if prepare is not None else None
        wait = channel.await_completion
        read = self._server.read if reader is None else reader
        if job is not None:
            return self._dispatch.after(job, stream, wait, stream, read, descs, fut)
        wait(stream, read, descs, fut)
        return None

    def get_resource(self, binding: Binding | Handle) -> asyncio.Future[BindingResource[Any]]:
        """See :meth:`ComputeClient.get_resource`."""
        self._channel.check()
        return self._dispatch.request(self._server.get_resource, _whole(binding).binding)


def _read_into(
    read_into: Callable[..., Any], outs: list[memoryview], descs: Any, stream: Any
) -> Any:
    return read_into(descs, outs, stream)


def writable_bytes(out: Any, nbytes: int) -> memoryview:
    """``out`` as a flat writable byte view of exactly ``nbytes`` bytes, or
    InvalidArgument saying what it is instead (``read_into``'s target)."""
    try:
        view = memoryview(out)
    except TypeError:
        raise InvalidArgument(
            f"read_into needs a writable buffer (bytearray, numpy array, a staging "
            f"buffer), got {type(out).__name__}"
        ) from None
    if view.readonly:
        raise InvalidArgument(
            f"read_into's target {type(out).__name__} is read-only; pass a writable "
            "buffer (bytearray(n), np.empty(...), a client.staging() buffer)"
        )
    if not view.c_contiguous:
        raise InvalidArgument(f"read_into's target {type(out).__name__} is not contiguous")
    if view.nbytes != nbytes:
        raise InvalidArgument(
            f"read_into's target holds {view.nbytes} bytes but the tensor has {nbytes}; "
            "pass a buffer of exactly that size"
        )
    return view.cast("B") if view.ndim != 1 or view.format != "B" else view
