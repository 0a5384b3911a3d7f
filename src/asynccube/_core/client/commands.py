"""The commands of a client: what :class:`~.client.ComputeClient` sends to its server.

``client.execute(...)`` -> :meth:`ClientCore.execute` checks its arguments and sends
:meth:`ClientCore._execute` through the channel (:mod:`.channel`), which runs it on the
actor: it prepares (compiles) in a worker thread if needed, then fires the server's
``execute``.

The routes of the main commands on CUDA, hop by hop (a hop in brackets is the carrier
that takes the command on: the channel, or the hot path, whose compiled module does what
its pure-Python twin ``cuda.native._twin`` does; ``tests/test_routes.py`` checks each name).
A launch, a small read of one buffer and a sync take the first route when the server's
``FastLaunch`` or ``FastSync`` takes them (``cuda.fast``, ``cuda.fast_sync`` say when),
else the second::

    route: client.commands.ClientCore.execute -> [cuda.native._twin.FastLaunch]
        -> driver:cuLaunchKernel
    route: client.commands.ClientCore.execute -> [channel.channel.Channel.send]
        -> client.commands.ClientCore._execute -> [channel.channel.Channel.fire]
        -> cuda.launch.LaunchOps.execute -> [cuda.native._twin.launch] -> driver:cuLaunchKernel
    route: client.commands.ClientCore.read -> [cuda.native._twin.FastLaunch]
        -> driver:cuMemcpyDtoHAsync
    route: client.commands.ClientCore.read -> [channel.channel.Channel.request]
        -> client.commands.ClientCore._read -> [channel.channel.Channel.await_completion]
        -> cuda.transfers.TransferOps.read -> cuda.transfers.TransferOps._read_one
        -> [cuda.native._twin.memcpy_async] -> driver:cuMemcpyDtoHAsync
    route: client.commands.ClientCore.sync -> [cuda.fast_sync.FastSync] -> driver:cuStreamQuery
    route: client.commands.ClientCore.sync -> [client.commands.ClientCore._request]
        -> cuda.server.CudaServer.sync -> stream.multi.MultiStream.flush_pending
        -> cuda.streams.CudaBackend.flush -> cuda.completion.EventPool.record
        -> [cuda.native._twin.event_record] -> driver:cuEventRecord
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Callable, Container, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..channel.channel import BATCH_SECONDS, Channel, State
from ..channel.completion import one_step_later, others_ready
from ..errors import InvalidArgument
from ..server.protocol import BindingResource, ComputeServer, DeviceProperties
from ..values.bindings import Bindings, CubeCount
from ..values.kernel import Kernel
from ..values.stream_id import StreamId
from ..values.types import Binding, CopyDescriptor, ExecutionMode, Handle
from .args import (
    DataLike,
    _bad_execute,
    _descriptor,
    _forget_staging,
    _is_int,
    _items,
    _whole,
    _write_items,
    as_bytes,
)
from .jobs import JobThread
from .memory import MemoryOps

__all__ = ["ClientCore"]

Job = Callable[[], None]
_get_running_loop = asyncio._get_running_loop


class ClientCore(MemoryOps):
    """The commands of :class:`ComputeClient`: allocation, data movement, execution and
    memory, each sent through the channel to the actor that owns the server.

    Every method must be called from the loop the client was opened on.
    ``batch_seconds``: the channel's budget of commands per loop iteration
    (``streaming.batch_us``).
    """

    def __init__(
        self,
        server: ComputeServer,
        loop: asyncio.AbstractEventLoop,
        *,
        batch_seconds: float = BATCH_SECONDS,
    ) -> None:
        self._server = server
        self._channel = Channel(server, loop, batch_seconds)
        # Optional server hooks: blocking work (compiling, loading, pinning memory) that
        # the actor runs in a worker thread before the command, never on the loop.
        self._prepare: Callable[..., Job | None] | None = getattr(server, "prepare", None)
        # Optional: the ids of kernels the server has loaded (a launch of one with a static
        # count has nothing to prepare: the call to ``prepare`` is skipped).
        self._loaded: Container[str] = getattr(server, "loaded_kernels", ())
        self._prepare_write: Callable[..., Job | None] | None = getattr(
            server, "prepare_write", None
        )
        self._prepare_read: Callable[..., Job | None] | None = getattr(server, "prepare_read", None)
        # Optional: a server-side snapshot of large data (CUDA: straight into pinned memory).
        self._server_snapshot: Callable[[Any], Any] | None = getattr(server, "snapshot", None)
        self._staging: dict[int, weakref.ref[npt.NDArray[np.uint8]]] = {}
        self._jobs = JobThread(loop)
        self._graph_registry: Any = None  # graph.py's registry, once a capture ran
        # Optional: a server's one-call launch route (CUDA: cuda/fast.py), offered each
        # launch first; it declines (False) whatever it does not take, before any change.
        fast = getattr(server, "fast_launcher", None)
        self._fast: Any = fast(self._channel) if fast is not None else None
        syncer = getattr(server, "fast_syncer", None)  # CUDA: cuda/fast_sync.py
        self._fast_sync: Any = syncer(self._channel) if syncer is not None else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device!r}, state={self._channel.state.value})"

    @property
    def device(self) -> str:
        """The device string (``"host"``, ``"cuda:0"``)."""
        return self._server.device

    @property
    def properties(self) -> DeviceProperties:
        """The device's properties."""
        return self._server.properties

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The client's event loop: asyncio's, or trio's adapter (``.token``: the run's)."""
        return self._channel.loop

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called (or the client died)."""
        return self._channel.state is not State.OPEN

    @property
    def server(self) -> ComputeServer:
        """The server (for inspection; drive it only through the client)."""
        return self._server

    # -- allocation -------------------------------------------------------------------

    def create(self, data: DataLike) -> Handle:
        """A new buffer holding a copy of ``data`` (bytes-like, or a numpy array's bytes).

        ``bytes`` are taken by reference (immutable), buffers from :meth:`staging` are
        handed over; any other buffer is copied now, so later changes to it do not leak
        into the buffer, except on the host server, which borrows one of 1 MiB or more
        (its worker copies it in stream order, off the loop): do not modify that one
        until an awaited call on this stream after it returns (README, "Data is
        snapshotted").
        """
        self._channel.check()
        raw = self._snapshot(data)
        nbytes = memoryview(raw).nbytes
        fast = self._fast  # FastLaunch.empty: a pool hit in one call, then the copy
        handle: Handle | None = fast.empty(nbytes) if fast is not None else None
        if handle is not None:
            copy = [(handle.copy_descriptor((nbytes,), (1,), 1), raw)]
            self._channel.send(self._write, StreamId.current(), copy)
            return handle
        handle = self._mint(nbytes)
        self._channel.send(self._create_with_data, StreamId.current(), handle, raw)
        return handle

    async def staging(self, sizes: Sequence[int]) -> list[npt.NDArray[np.uint8]]:
        """Host buffers that ``write``/``create`` take without a copy (page-locked on
        CUDA, so a write from one runs at full transfer bandwidth).

        Fill one (``np.copyto(buf, data.view(np.uint8).ravel())``), then pass it to
        ``write`` or ``create``: it is handed over, not snapshotted, so do not modify it
        until that work is done (``await client.sync()``). Allocating page-locked memory
        is slow, so this runs in a worker thread.
        """
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

    def _snapshot(self, data: Any) -> Any:
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

    def _create_with_data(self, stream: StreamId, handle: Handle, raw: Any) -> Any:
        fire, create = self._channel.fire_writing, self._server.create_with_data
        written = [handle]
        if self._prepare_write is not None:
            size = handle.buffer_size
            job = self._prepare_write([(handle.copy_descriptor((size,), (1,), 1), raw)], stream)
            if job is not None:
                return self._after(job, stream, fire, stream, written, create, handle, raw)
        fire(stream, written, create, handle, raw)
        return None

    def empty(self, size: int) -> Handle:
        """A new uninitialized buffer of ``size`` bytes."""
        fast = self._fast  # FastLaunch.empty: a pool hit in one call
        if fast is not None:
            taken: Handle | None = fast.empty(size)
            if taken is not None:
                return taken
        channel = self._channel
        if (
            channel.state is not State.OPEN
            or _get_running_loop() is not channel.loop
            or channel.guard is not None  # a graph capture is open
        ):
            channel.check()  # raises, unless only the capture guard had to see it
        stream = StreamId.current()
        handle = self._mint(size, stream)
        channel.send(channel.fire, stream, self._server.create, [handle])
        return handle

    # -- data movement ------------------------------------------------------------------

    def write(self, items: Sequence[tuple[CopyDescriptor, DataLike]], *extra: object) -> None:
        """Write dense data into each (possibly strided) tensor, in stream order:
        ``client.write([(descriptor, data), ...])`` (one list; ``extra`` is refused). The
        data is snapshotted or borrowed as for :meth:`create`."""
        self._channel.check()
        copies = [(_descriptor(d), self._snapshot(data)) for d, data in _write_items(items, extra)]
        self._channel.send(self._write, StreamId.current(), copies)

    def _write(self, stream: StreamId, copies: list[tuple[CopyDescriptor, Any]]) -> Any:
        job = self._prepare_write(copies, stream) if self._prepare_write is not None else None
        fire, written = self._channel.fire_writing, [d.binding for d, _ in copies]
        if job is not None:
            return self._after(job, stream, fire, stream, written, self._server.write, copies)
        fire(stream, written, self._server.write, copies)
        return None

    def read(self, bindings: Sequence[Binding | Handle]) -> asyncio.Future[list[bytes]]:
        """The bytes of each binding (awaitable)."""
        fast = self._fast  # FastLaunch.read: a small read of one buffer in one call
        if fast is not None and type(bindings) in (list, tuple) and len(bindings) == 1:
            done = fast.read(bindings[0])
            if done is not None:
                return done  # type: ignore[no-any-return]
        self._channel.check()
        descs = [_whole(b) for b in _items("read", "bindings", bindings)]
        channel = self._channel
        return channel.request(self._read, StreamId.current(), descs)

    def read_tensor(self, descriptors: Sequence[CopyDescriptor]) -> asyncio.Future[list[bytes]]:
        """The bytes of each (possibly strided) tensor, densely packed (awaitable)."""
        self._channel.check()
        descs = [_descriptor(d) for d in _items("read_tensor", "descriptors", descriptors)]
        channel = self._channel
        return channel.request(self._read, StreamId.current(), descs)

    def _read_arrays(self, descs: list[CopyDescriptor]) -> asyncio.Future[list[Any]] | None:
        """Like :meth:`read_tensor` (the caller checked the channel), each result a new
        writable uint8 array the caller owns, where the server makes them (the host's
        ``read_arrays``: no copy on the loop); None where it does not."""
        reader = getattr(self._server, "read_arrays", None)
        if reader is None:
            return None
        read = functools.partial(self._read, reader=reader)
        return self._channel.request(read, StreamId.current(), descs)

    def _read(
        self,
        stream: StreamId,
        descs: list[CopyDescriptor],
        fut: Any,
        reader: Callable[..., Any] | None = None,
    ) -> Any:
        channel = self._channel
        if channel._clears_at_call and channel._held._tainted:  # CUDA: checked when issued
            error = channel._held.check([d.binding.memory.id for d in descs])
            if error is not None:
                channel.refuse(fut, stream, error)
                return None
        job = self._prepare_read(descs, stream) if self._prepare_read is not None else None
        wait = channel.await_completion
        read = self._server.read if reader is None else reader
        if job is not None:
            return self._after(job, stream, wait, stream, read, descs, fut)
        wait(stream, read, descs, fut)
        return None

    def sync(self) -> asyncio.Future[None]:
        """Completes once all work queued so far, on every stream, is done (awaitable).

        Raises the first error held for the calling task's stream. Graphs whose
        ``Graph`` object is gone are released first, so their buffers count as free.
        Awaiting it suspends at least once, even when the device is already done, so
        tasks cancelled before it have unwound: the next ``memory_usage()`` counts
        every handle dropped before the sync as free.
        """
        fast = self._fast_sync  # FastSync: the device is done within a few µs
        if fast is not None and self._graph_registry is None:
            done = fast()
            if done is not None:
                return done  # type: ignore[no-any-return]
        self._channel.check()
        if self._graph_registry is not None:
            self._graph_registry.drain()
        fut = self._request(self._server.sync)
        channel = self._channel
        if fut.done() and others_ready(channel.loop, channel):
            return one_step_later(channel.new_future, fut)  # settled inline: suspend once
        return fut

    def get_resource(self, binding: Binding | Handle) -> asyncio.Future[BindingResource[Any]]:
        """The storage behind ``binding`` (a numpy view on host, a pointer on CUDA)."""
        self._channel.check()
        return self._request(self._server.get_resource, _whole(binding).binding)

    # -- execution ----------------------------------------------------------------------

    def execute(
        self,
        kernel: Kernel,
        count: CubeCount,
        bindings: Bindings,
        mode: ExecutionMode = ExecutionMode.CHECKED,
    ) -> None:
        """Queue ``kernel`` over ``bindings`` with ``count`` cubes (fire-and-forget)."""
        fast = self._fast  # the server's FastLaunch (CUDA: cuda/fast.py), or None
        if fast is not None and fast(kernel, count, bindings, mode):
            return  # taken in one call; else the Python route below
        channel = self._channel
        if (
            channel.state is not State.OPEN
            or _get_running_loop() is not channel.loop
            or channel.guard is not None  # a graph capture is open
        ):
            channel.check()  # raises, unless only the capture guard had to see it
        if type(kernel) is not Kernel or type(count) is not CubeCount:
            _bad_execute(kernel, count, bindings, mode)
        if type(bindings) is not Bindings or type(mode) is not ExecutionMode:
            _bad_execute(kernel, count, bindings, mode)
        if count.binding is not None and channel.guard is not None:
            channel.guard("execute with a dynamic CubeCount")  # its count is read back first
        channel.send(self._execute, StreamId.current(), kernel, count, bindings, mode)

    def _execute(
        self,
        stream: StreamId,
        kernel: Kernel,
        count: CubeCount,
        bindings: Bindings,
        mode: ExecutionMode,
    ) -> Any:
        fast = self._fast  # run by the actor (a caller running it inline was declined)
        in_actor = fast is not None and self._channel.in_actor()
        if in_actor and fast.queued(kernel, count, bindings, mode, stream):
            return None
        prepare = self._prepare
        if prepare is None or (count.binding is None and kernel.id in self._loaded):
            job = None
        else:
            job = prepare(kernel, count, stream)
        if job is not None:
            fire, execute = self._channel.fire_writing, self._server.execute
            written = _written(bindings)
            return self._after(
                job, stream, fire, stream, written, execute, kernel, count, bindings, mode
            )
        channel = self._channel
        try:  # Channel.fire_writing, inlined: one frame less per launch
            self._server.execute(kernel, count, bindings, mode, stream)
        except BaseException as exc:
            channel.hold(stream, exc)
            channel.taint(stream, _written(bindings), exc)
            return None
        if channel._clears_at_call and channel._held._tainted:
            channel._held.clear(b.memory.id for b in _written(bindings))
        return None

    async def _after(
        self, job: Job, stream: StreamId, then: Callable[..., None], *args: Any
    ) -> None:
        """Run ``job`` in a worker thread (the actor waits, so order is kept), then
        ``then(*args)``. A failed job is held for ``stream``: it is raised by ``then`` when
        that is an awaited command, else at the next awaited command on the stream."""
        try:
            await self._jobs.run(job)
        except Exception as exc:
            channel = self._channel
            channel.hold(stream, exc)
            if then == channel.fire_writing:  # ==: each access makes a new bound method
                channel.taint(stream, args[1], exc)  # fire-and-forget: the command is
                return  # skipped, its error held and its buffers tainted
            if then == channel.fire:
                return
        self._channel.activate()  # another client's commands may have run meanwhile
        then(*args)

    def flush(self) -> None:
        """Submit work buffered for the calling task's stream."""
        self._channel.check()
        self._send_fire(self._server.flush)


def _written(bindings: Bindings) -> list[Binding]:
    """The bindings a launch may write: its buffers and its tensor maps' buffers."""
    if not bindings.tensor_maps:
        return list(bindings.buffers)
    return [*bindings.buffers, *(t.binding for t in bindings.tensor_maps)]
