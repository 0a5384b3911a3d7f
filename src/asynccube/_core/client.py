"""ComputeClient: the public face of a server, driven through the channel."""

from __future__ import annotations

import asyncio
import functools
import itertools
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import numpy.typing as npt

from .channel import Channel, State
from .errors import BufferTooBig, InvalidArgument, ProfileError
from .jobs import JobThread
from .kernel import Kernel
from .memory.management import MemoryReport
from .profiling import ProfileSummary
from .server import BindingResource, BytesLike, ComputeServer, DeviceProperties
from .stream_id import StreamId
from .tensor import Tensor, as_bytes
from .timeline import Timeline
from .types import (
    AllocationDescriptor,
    AllocationKind,
    Binding,
    Bindings,
    CopyDescriptor,
    CubeCount,
    ExecutionMode,
    Handle,
    MemoryAllocationMode,
    MemoryUsage,
    ProfileDuration,
    ProfilingToken,
)

__all__ = ["ComputeClient"]

DataLike = BytesLike | npt.NDArray[Any]
Job = Callable[[], None]


class ComputeClient:
    """Sends work to one server through an actor task on the current event loop.

    Create it with :func:`open_client` (``async with``) or :func:`connect`. Every method
    must be called from the loop the client was opened on (other threads: use
    ``asyncio.run_coroutine_threadsafe(coro, client.loop)``); a call from elsewhere
    raises LoopMismatchError. Methods returning futures queue their command at once, so
    ``fut = client.read(...)`` orders the read before any later call even before it is
    awaited.
    """

    def __init__(self, server: ComputeServer, loop: asyncio.AbstractEventLoop) -> None:
        self._server = server
        self._channel = Channel(server, loop)
        # Optional server hooks: blocking work (compiling, loading, pinning memory) that
        # the actor runs in a worker thread before the command, never on the loop.
        self._prepare: Callable[..., Job | None] | None = getattr(server, "prepare", None)
        self._prepare_write: Callable[..., Job | None] | None = getattr(
            server, "prepare_write", None
        )
        self._prepare_read: Callable[..., Job | None] | None = getattr(server, "prepare_read", None)
        self._staging: dict[int, weakref.ref[npt.NDArray[np.uint8]]] = {}
        self._jobs = JobThread(loop)
        self._profile_ids = itertools.count(1)
        self._profiles: dict[int, ProfilingToken] = {}
        self._closing: asyncio.Future[Any] | None = None
        self.profile_summary = ProfileSummary()
        """Named profiles (``client.profile(name)``) aggregated: count, total, mean..."""

    def __repr__(self) -> str:
        return f"ComputeClient(device={self.device!r}, state={self._channel.state.value})"

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
        """The event loop this client runs on."""
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
        into the buffer.
        """
        self._channel.check()
        raw = self._snapshot(data)
        handle = self._mint(memoryview(raw).nbytes)
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
        for n in sizes:
            if not isinstance(n, int) or n < 0:
                raise InvalidArgument(f"staging sizes must be ints >= 0, got {n!r}")
        stream = StreamId.current()
        views = await self._jobs.run(lambda: self._server.staging(list(sizes), stream))
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
        return as_bytes(data)

    def _create_with_data(self, stream: StreamId, handle: Handle, raw: Any) -> Any:
        fire, create = self._channel.fire, self._server.create_with_data
        if self._prepare_write is not None:
            size = handle.buffer_size
            job = self._prepare_write([(handle.copy_descriptor((size,), (1,), 1), raw)], stream)
            if job is not None:
                return self._after(job, stream, fire, stream, create, handle, raw)
        fire(stream, create, handle, raw)
        return None

    def empty(self, size: int) -> Handle:
        """A new uninitialized buffer of ``size`` bytes."""
        self._channel.check()
        handle = self._mint(size)
        self._send_fire(self._server.create, [handle])
        return handle

    def create_tensors(
        self,
        data: Sequence[DataLike],
        shapes: Sequence[Sequence[int]],
        elem_sizes: Sequence[int],
        kind: AllocationKind = AllocationKind.OPTIMIZED,
    ) -> list[tuple[Handle, tuple[int, ...]]]:
        """New tensors holding ``data`` (dense, row-major); returns (handle, strides)."""
        self._channel.check()
        _same_length(data=data, shapes=shapes, elem_sizes=elem_sizes)
        out = self._new_tensors(shapes, elem_sizes, kind)
        items = []
        for (handle, strides), raw, shape, elem in zip(out, data, shapes, elem_sizes, strict=True):
            items.append((handle.copy_descriptor(shape, strides, elem), as_bytes(raw)))
        self.write(items)
        return out

    def empty_tensors(
        self,
        shapes: Sequence[Sequence[int]],
        elem_sizes: Sequence[int],
        kind: AllocationKind = AllocationKind.OPTIMIZED,
    ) -> list[tuple[Handle, tuple[int, ...]]]:
        """New uninitialized tensors; OPTIMIZED ones have pitched rows. Returns
        (handle, strides in elements) for each."""
        self._channel.check()
        _same_length(shapes=shapes, elem_sizes=elem_sizes)
        return self._new_tensors(shapes, elem_sizes, kind)

    def _new_tensors(
        self,
        shapes: Sequence[Sequence[int]],
        elem_sizes: Sequence[int],
        kind: AllocationKind,
    ) -> list[tuple[Handle, tuple[int, ...]]]:
        descs = [
            AllocationDescriptor(kind, tuple(s), e) for s, e in zip(shapes, elem_sizes, strict=True)
        ]
        layouts = [self._server.layout(d) for d in descs]
        handles = [self._mint(size) for size, _ in layouts]
        self._send_fire(self._server.create, handles)
        return [(h, strides) for h, (_, strides) in zip(handles, layouts, strict=True)]

    def _mint(self, size: int) -> Handle:
        if not isinstance(size, int) or isinstance(size, bool):
            raise InvalidArgument(f"size must be an int, got {type(size).__name__}")
        limit = self._server.properties.max_allocation
        if size < 0:
            raise BufferTooBig(size, "sizes must be >= 0")
        if size > limit:
            raise BufferTooBig(size, f"the largest allocation on {self.device} is {limit} bytes")
        return self._server.new_handle(size, StreamId.current())

    # -- data movement ------------------------------------------------------------------

    def write(self, items: Sequence[tuple[CopyDescriptor, DataLike]]) -> None:
        """Write dense data into each (possibly strided) tensor, in stream order."""
        self._channel.check()
        copies = [(_descriptor(d), self._snapshot(data)) for d, data in items]
        self._channel.send(self._write, StreamId.current(), copies)

    def _write(self, stream: StreamId, copies: list[tuple[CopyDescriptor, Any]]) -> Any:
        job = self._prepare_write(copies, stream) if self._prepare_write is not None else None
        if job is not None:
            return self._after(job, stream, self._channel.fire, stream, self._server.write, copies)
        self._channel.fire(stream, self._server.write, copies)
        return None

    def read(self, bindings: Sequence[Binding | Handle]) -> asyncio.Future[list[bytes]]:
        """The bytes of each binding (awaitable)."""
        self._channel.check()
        descs = [_whole(b) for b in bindings]
        channel = self._channel
        return channel.request(self._read, StreamId.current(), descs)

    def read_tensor(self, descriptors: Sequence[CopyDescriptor]) -> asyncio.Future[list[bytes]]:
        """The bytes of each (possibly strided) tensor, densely packed (awaitable)."""
        self._channel.check()
        descs = [_descriptor(d) for d in descriptors]
        channel = self._channel
        return channel.request(self._read, StreamId.current(), descs)

    def _read(self, stream: StreamId, descs: list[CopyDescriptor], fut: Any) -> Any:
        job = self._prepare_read(descs, stream) if self._prepare_read is not None else None
        wait = self._channel.await_completion
        if job is not None:
            return self._after(job, stream, wait, stream, self._server.read, descs, fut)
        wait(stream, self._server.read, descs, fut)
        return None

    def sync(self) -> asyncio.Future[None]:
        """Completes once all work queued so far, on every stream, is done (awaitable).

        Raises the first error held for the calling task's stream.
        """
        self._channel.check()
        return self._request(self._server.sync)

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
        channel = self._channel
        channel.check()
        if type(kernel) is not Kernel or type(count) is not CubeCount:
            _bad_execute(kernel, count, bindings, mode)
        if type(bindings) is not Bindings or type(mode) is not ExecutionMode:
            _bad_execute(kernel, count, bindings, mode)
        channel.send(self._execute, StreamId.current(), kernel, count, bindings, mode)

    def _execute(
        self,
        stream: StreamId,
        kernel: Kernel,
        count: CubeCount,
        bindings: Bindings,
        mode: ExecutionMode,
    ) -> Any:
        job = self._prepare(kernel, count, stream) if self._prepare is not None else None
        fire = self._channel.fire
        if job is not None:
            execute = self._server.execute
            return self._after(job, stream, fire, stream, execute, kernel, count, bindings, mode)
        fire(stream, self._server.execute, kernel, count, bindings, mode)
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
            self._channel.hold(stream, exc)
            if then == self._channel.fire:  # ==: each access makes a new bound method
                return  # fire-and-forget: skip the command; the error is held
        then(*args)

    def flush(self) -> None:
        """Submit work buffered for the calling task's stream."""
        self._channel.check()
        self._send_fire(self._server.flush)

    # -- memory -------------------------------------------------------------------------

    def memory_usage(self) -> asyncio.Future[MemoryUsage]:
        """Current memory usage (awaitable)."""
        self._channel.check()
        channel = self._channel
        return channel.request(channel.call, StreamId.current(), self._server.memory_usage)

    def memory_cleanup(self) -> None:
        """Release memory nothing uses."""
        self._channel.check()
        self._send_fire(self._server.memory_cleanup)

    def allocation_mode(self, mode: MemoryAllocationMode) -> None:
        """Switch which pools new allocations come from (AUTO or PERSISTENT)."""
        self._channel.check()
        if not isinstance(mode, MemoryAllocationMode):
            raise InvalidArgument(f"mode must be a MemoryAllocationMode, got {mode!r}")
        self._send_fire(self._server.allocation_mode, mode)

    # -- profiling ----------------------------------------------------------------------

    def start_profile(self) -> ProfilingToken:
        """Start a profile of the work queued from now on; profiles nest and overlap."""
        self._channel.check()
        token = ProfilingToken(next(self._profile_ids))
        self._send_fire(self._start_profile, token)
        return token

    def _start_profile(self, token: ProfilingToken, stream: StreamId) -> None:
        self._profiles[token.id] = self._server.start_profile(stream)

    def end_profile(self, token: ProfilingToken) -> asyncio.Future[ProfileDuration]:
        """End ``token``'s profile; the future gives its duration."""
        self._channel.check()
        if not isinstance(token, ProfilingToken):
            raise InvalidArgument(f"expected a ProfilingToken, got {token!r}")
        return self._request(self._end_profile, token)

    def _end_profile(self, token: ProfilingToken, stream: StreamId) -> Any:
        server_token = self._profiles.pop(token.id, None)
        if server_token is None:
            raise ProfileError(f"{token} was never started or has already ended")
        return self._server.end_profile(stream, server_token)

    @asynccontextmanager
    async def profile(self, name: str | None = None) -> AsyncIterator[list[ProfileDuration]]:
        """``async with client.profile("step") as out:`` profiles the block.

        ``out[0]`` is the duration once the block has exited; a named profile is also
        added to :attr:`profile_summary`.
        """
        token = self.start_profile()
        out: list[ProfileDuration] = []
        try:
            yield out
        finally:
            duration = await self.end_profile(token)
            out.append(duration)
            if name is not None:
                self.profile_summary.add(name, duration)

    async def timeline(self) -> Timeline:
        """The kernels and copies recorded so far, per stream, once queued work is done.

        Records are kept at profiling level ``medium`` or ``full`` (config
        ``[profiling] level`` or ``ASYNCCUBE_PROFILING_LEVEL``). ``timeline.save(path)``
        writes a Chrome trace / Perfetto JSON file; in Jupyter it renders as a plot.
        """
        await self.sync()
        channel = self._channel
        records = await channel.request(
            channel.call, StreamId.current(), self._server.kernel_records
        )
        return Timeline(records, device=self.device)

    def memory_report(self) -> asyncio.Future[MemoryReport]:
        """Usage, pages and peaks of each memory pool (awaitable; an HTML table in Jupyter)."""
        self._channel.check()
        channel = self._channel
        return channel.request(channel.call, StreamId.current(), self._server.memory_report)

    # -- numpy helpers ------------------------------------------------------------------

    def create_array(self, array: npt.ArrayLike) -> Tensor:
        """A new tensor holding a copy of ``array`` (contiguous layout)."""
        arr = np.ascontiguousarray(array)
        handle = self.create(arr)
        strides = tuple(s // arr.itemsize for s in arr.strides) if arr.ndim else ()
        return Tensor(handle, arr.shape, strides, arr.dtype)

    def empty_array(
        self,
        shape: Sequence[int],
        dtype: npt.DTypeLike,
        kind: AllocationKind = AllocationKind.CONTIGUOUS,
    ) -> Tensor:
        """A new uninitialized tensor of ``shape`` and ``dtype``."""
        dt = np.dtype(dtype)
        ((handle, strides),) = self.empty_tensors([tuple(shape)], [dt.itemsize], kind)
        return Tensor(handle, tuple(shape), strides, dt)

    async def read_array(
        self,
        source: Tensor | Binding | Handle,
        dtype: npt.DTypeLike | None = None,
        shape: Sequence[int] | None = None,
    ) -> npt.NDArray[Any]:
        """Read a tensor (or a buffer, given ``dtype`` and optionally ``shape``) into a
        new numpy array of the right dtype and shape."""
        if isinstance(source, Tensor):
            (raw,) = await self.read_tensor([source.copy_descriptor()])
            return np.frombuffer(raw, dtype=source.dtype).reshape(source.shape).copy()
        if dtype is None:
            raise InvalidArgument("read_array of a Handle or Binding needs dtype=")
        (raw,) = await self.read([source])
        flat = np.frombuffer(raw, dtype=np.dtype(dtype)).copy()
        return flat if shape is None else flat.reshape(tuple(shape))

    # -- lifecycle ----------------------------------------------------------------------

    async def close(self) -> None:
        """Finish queued work, release the server, and refuse every later call.

        Raises the first fire-and-forget error nobody awaited (others attached as
        notes), after closing. Closing again is a no-op.
        """
        channel = self._channel
        if channel.state is State.OPEN:
            self._closing = channel.begin_close()
        try:
            if self._closing is not None and not self._closing.done():
                await asyncio.shield(self._closing)
            await channel.wait_actor()
        finally:
            self._jobs.close()

    async def __aenter__(self) -> ComputeClient:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            await self.close()
        except Exception:
            if exc is None:
                raise

    # -- plumbing -----------------------------------------------------------------------

    def _send_fire(self, fn: Callable[..., Any], *args: Any) -> None:
        channel = self._channel
        channel.send(channel.fire, StreamId.current(), fn, *args)

    def _request(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        channel = self._channel
        return channel.request(channel.await_completion, StreamId.current(), fn, *args)


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
