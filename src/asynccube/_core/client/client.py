"""ComputeClient: the public face of a server, driven through the channel.

One class, composed of named parts that each own one responsibility (the client holds
them; each public method that is not on the hot path is a thin delegate to one):

* :class:`~.dispatch.Dispatch`: sending a command to the actor with the calling task's
  stream, fired or awaited, after a prepare job in a worker thread where needed;
* :class:`~.memory.ClientMemory`: handles minted after the size checks, tensors and
  their layouts, the memory commands;
* :class:`~.movement.DataMovement`: snapshots and staging buffers, writes and reads;
* :class:`~.launch.Launcher`: the actor's half of ``execute`` (prepare, fire, hold);
* :class:`~.profiler.ClientProfiler`: profiles and the timeline;
* :class:`~.warmup.WarmUp`: the warm-up and tuning scopes (``warm_up``, ``tuning``);
* :class:`~.surface.ClientSurface` (a base class): the memory and profiling
  commands, thin delegates to their parts;
* :class:`~.coordination.ClientCoordination` (a base class): ``read_into``,
  ``wait``/``after`` and ``exclusive``/``exclusive_call``;
* :class:`~.lifecycle.Lifecycle`: the close (and :mod:`.lifecycle`'s exit and warning);
* :mod:`.arrays` (numpy helpers), :mod:`.graph` (captures), :mod:`.transfer`
  (``to_client``), :mod:`.interop` (DLPack) and :mod:`.foreign` (``wait``/``after``
  on other libraries' streams): functions over the client.

The hot path (``execute``, ``read``, ``sync``, ``empty``, ``create``) keeps its bodies
here, one Python call each, with the server's compiled fast routes (``_fast``,
``_fast_sync``) tried first.

The route of each main command, hop by hop, is in the package's docstring
(:mod:`asynccube._core.client`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import numpy as np
import numpy.typing as npt

from ..channel.channel import BATCH_SECONDS, Channel, State
from ..channel.completion import later_futures, one_step_later
from ..channel.footprint import Footprint
from ..config.config import AsyncCubeConfig
from ..errors import InvalidArgument
from ..profiling.records import ProfileSummary
from ..profiling.timeline import Timeline
from ..server.protocol import BindingResource, ComputeServer, DeviceProperties
from ..values.bindings import Bindings, CubeCount
from ..values.kernel import Kernel
from ..values.stream_id import StreamId
from ..values.types import (
    AllocationKind,
    Binding,
    CopyDescriptor,
    ExecutionMode,
    Handle,
)
from . import arrays
from .args import (
    DataLike,
    _bad_execute,
    _foreign_launch,
    _items,
    _numeric_dtype,
    _read_item,
    _zero_count,
)
from .coordination import ClientCoordination
from .dispatch import Dispatch
from .graph import Graph, capture, release_graphs
from .jobs import JobThread
from .launch import Launcher
from .lifecycle import Lifecycle, close_within, warn_unclosed
from .memory import ClientMemory
from .movement import DataMovement
from .profiler import ClientProfiler
from .surface import ClientSurface
from .tensor import Tensor
from .transfer import to_client
from .warmup import Scope, WarmUp, WarmUpStats

__all__ = ["ComputeClient"]

_get_running_loop = asyncio._get_running_loop
_CHECKED = ExecutionMode.CHECKED


class ComputeClient(ClientCoordination, ClientSurface):
    """Sends work to one server through an actor task on the current event loop
    (asyncio, uvloop included, or trio).

    Create it with :func:`open_client` (``async with``) or :func:`connect`. Every method
    must be called from the loop the client was opened on (other threads: use
    ``asyncio.run_coroutine_threadsafe(coro, client.loop)``, or under trio
    ``trio.from_thread.run(fn, trio_token=client.loop.token)``); a call from elsewhere
    raises LoopMismatchError. Methods returning futures queue their command at once, so
    ``fut = client.read(...)`` orders the read before any later call even before it is
    awaited. ``batch_seconds`` bounds the commands run in one loop iteration before the
    client yields (``streaming.batch_us`` when opened through ``open_client``).
    """

    def __init__(
        self,
        server: ComputeServer,
        loop: asyncio.AbstractEventLoop,
        *,
        batch_seconds: float = BATCH_SECONDS,
    ) -> None:
        self._server = server
        self._channel = channel = Channel(server, loop, batch_seconds)
        self._jobs = JobThread(loop)
        # The token this server's handles carry (``handle.memory.queue``): a binding of
        # another client is refused at the call (None: a server without one, unchecked).
        self._owner: object = getattr(server, "handle_owner", None)
        self._graph_registry: Any = None  # graph.py's registry, once a capture ran
        # Optional: a server's one-call launch route (CUDA: cuda/fast.py), offered each
        # launch first; it declines (False) whatever it does not take, before any change.
        fast = getattr(server, "fast_launcher", None)
        self._fast: Any = fast(channel) if fast is not None else None
        # With one, the hot commands go to the channel with their stream and buffers
        # (``send_tracked``), so that a command (or a one-call route) whose stream and
        # buffers nothing queued touches need not wait behind other tasks' commands.
        if self._fast is not None:
            channel.footprint = Footprint()
            self._fast.set_footprint(channel.footprint)
        syncer = getattr(server, "fast_syncer", None)  # CUDA: cuda/fast_sync.py
        self._fast_sync: Any = syncer(channel) if syncer is not None else None
        self._later = later_futures(channel)  # a sync settled inline: one_step_later
        # The parts (see the module docstring).
        self._dispatch = dispatch = Dispatch(channel, self._jobs)
        self._movement = DataMovement(server, channel, dispatch, self._jobs)
        self._memory = ClientMemory(server, channel, dispatch, self._movement)
        self._launcher = Launcher(server, channel, dispatch, self._fast)
        self._profiler = ClientProfiler(server, channel, dispatch)
        self._warm = WarmUp(server, channel)
        self._lifecycle = Lifecycle(channel, self._jobs)
        self.profile_summary = ProfileSummary()
        """Named profiles (``client.profile(name)``) aggregated: count, total, mean..."""
        self.config: AsyncCubeConfig | None = None
        """The configuration the client was opened with (``open_client``/``connect``)."""
        self.config_from_code: frozenset[str] = frozenset()
        """The ``"section.key"`` values set in code (``open_client(config=...)``)."""

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

    # -- allocation (the hot path's create and empty; tensors: the memory part) ---------

    def create(self, data: DataLike) -> Handle:
        """A new buffer holding a copy of ``data`` (bytes-like, or a numpy array's bytes).

        ``bytes`` are taken by reference (immutable), buffers from :meth:`staging` are
        handed over; any other buffer is copied now, so later changes to it do not leak
        into the buffer, except one of 1 MiB or more, which is borrowed (always on the
        host server, on CUDA when no pinned buffer of its size is free: a worker copies
        it in stream order, off the loop): do not modify that one until an awaited call
        on this stream after it returns (docs: "Data is snapshotted, large data is
        borrowed").
        """
        fast = self._fast
        if fast is not None and type(data) is bytes:
            # FastLaunch.empty (a pool hit) and .write (the staging copy and its command):
            # two calls, each declining before any change (the route then acts)
            nbytes = len(data)
            handle: Handle | None = fast.empty(nbytes)
            if handle is not None:
                if fast.write(handle, data):
                    return handle
                return self._write_created(handle, data, nbytes)
            self._channel.check()
            raw: Any = data  # bytes: taken by reference
        else:
            self._channel.check()
            raw = self._movement.snapshot(data)
            nbytes = memoryview(raw).nbytes
            handle = fast.empty(nbytes) if fast is not None else None
            if handle is not None:
                return self._write_created(handle, raw, nbytes)
        stream = StreamId.current()
        handle = self._memory.mint(nbytes, stream)
        create = self._movement.create_with_data
        self._channel.send_tracked(create, [handle.memory.id], stream, handle, raw)
        return handle

    def _write_created(self, handle: Handle, raw: Any, nbytes: int) -> Handle:
        """``create``'s copy into ``handle`` (just taken by ``FastLaunch.empty``) through
        the route: a tracked write command."""
        stream = StreamId.current()
        copy = [(handle.copy_descriptor((nbytes,), (1,), 1), raw)]
        write = self._movement.write_on_actor
        self._channel.send_tracked(write, [handle.memory.id], stream, copy)
        return handle

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
        handle = self._memory.mint(size, stream)
        create = self._server.create
        channel.send_tracked(channel.fire, [handle.memory.id], stream, create, [handle])
        return handle

    def create_tensors(
        self,
        data: Sequence[DataLike],
        shapes: Sequence[Sequence[int]],
        elem_sizes: Sequence[int],
        kind: AllocationKind = AllocationKind.OPTIMIZED,
    ) -> list[tuple[Handle, tuple[int, ...]]]:
        """New tensors holding ``data`` (dense, row-major); returns (handle, strides)."""
        return self._memory.create_tensors(data, shapes, elem_sizes, kind)

    def empty_tensors(
        self,
        shapes: Sequence[Sequence[int]],
        elem_sizes: Sequence[int],
        kind: AllocationKind = AllocationKind.OPTIMIZED,
    ) -> list[tuple[Handle, tuple[int, ...]]]:
        """New uninitialized tensors; OPTIMIZED ones have pitched rows. Returns
        (handle, strides in elements) for each."""
        return self._memory.empty_tensors(shapes, elem_sizes, kind)

    async def staging(self, sizes: Sequence[int]) -> list[npt.NDArray[np.uint8]]:
        """Host buffers that ``write``/``create`` take without a copy (page-locked on
        CUDA, so a write from one runs at full transfer bandwidth).

        Fill one (``np.copyto(buf, data.view(np.uint8).ravel())``), then pass it to
        ``write`` or ``create``: it is handed over, not snapshotted, so do not modify it
        until that work is done (``await client.sync()``). Allocating page-locked memory
        is slow, so this runs in a worker thread.
        """
        return await self._movement.staging(sizes)

    # -- data movement (the hot path's read and sync; the rest: the data-movement part) -

    def write(self, items: Sequence[tuple[CopyDescriptor, DataLike]], *extra: object) -> None:
        """Write dense data into each (possibly strided) tensor, in stream order:
        ``client.write([(descriptor, data), ...])`` (one list; ``extra`` is refused). The
        data is snapshotted or borrowed as for :meth:`create`."""
        self._movement.write(items, *extra)

    def read(self, bindings: Sequence[Binding | Handle | Tensor]) -> asyncio.Future[list[bytes]]:
        """The bytes of each binding (awaitable); of a :class:`Tensor`, its elements,
        densely packed (as ``read_tensor([tensor])``: a pitched one without its padding)."""
        fast = self._fast  # FastLaunch.read: a small read of one buffer in one call
        if fast is not None and type(bindings) in (list, tuple) and len(bindings) == 1:
            done = fast.read(bindings[0])
            if done is not None:
                return done  # type: ignore[no-any-return]
        self._channel.check()
        descs = [_read_item(b) for b in _items("read", "bindings", bindings)]
        mids = [d.binding.memory.id for d in descs]
        read = self._movement.read_on_actor
        return self._channel.request_tracked(read, mids, StreamId.current(), descs)

    def read_tensor(self, descriptors: Sequence[CopyDescriptor]) -> asyncio.Future[list[bytes]]:
        """The bytes of each (possibly strided) tensor, densely packed (awaitable)."""
        return self._movement.read_tensor(descriptors)

    def sync(self) -> asyncio.Future[None]:
        """Completes once all work queued so far, on every stream, is done (awaitable).

        Raises the first error held for the calling task's stream. Graphs whose
        ``Graph`` object is gone are released first, so their buffers count as free.
        Awaiting it suspends at least once, even when the device is already done (then
        exactly once, under asyncio and uvloop: the caller wakes in the next loop
        iteration), so tasks cancelled before it have unwound: the next
        ``memory_usage()`` counts every handle dropped before the sync as free.
        """
        fast = self._fast_sync  # FastSync: the device is done within a few µs
        if fast is not None and self._graph_registry is None:
            done = fast()
            if done is not None:
                return done  # type: ignore[no-any-return]
        self._channel.check()
        if self._graph_registry is not None:
            self._graph_registry.drain()
        channel = self._channel
        fut = channel.request(channel.await_completion, StreamId.current(), self._server.sync)
        if fut.done():  # settled inline: suspend exactly once (see one_step_later)
            return one_step_later(self._later, fut)
        return fut

    def get_resource(self, binding: Binding | Handle) -> asyncio.Future[BindingResource[Any]]:
        """The storage behind ``binding`` (a numpy view on host, a pointer on CUDA)."""
        return self._movement.get_resource(binding)

    # -- execution (the actor's half: the launcher part) --------------------------------

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
        launch: Any = self._launcher.launch
        if (
            channel.state is not State.OPEN
            or _get_running_loop() is not channel.loop
            or channel.guard is not None  # a graph capture, an exclusive block, a warm-up
        ):
            channel.check()  # raises, unless only the capture guard had to see it
            launch = self._warm.launch_for(launch)  # the task's warm-up scope drops it
        if type(kernel) is not Kernel or type(count) is not CubeCount:
            _bad_execute(kernel, count, bindings, mode)
        if type(bindings) is not Bindings or type(mode) is not ExecutionMode:
            _bad_execute(kernel, count, bindings, mode)
        if mode is _CHECKED and not (count.x and count.y and count.z):
            _zero_count(kernel, count)  # refused at the call: a GPU refuses it too
        owner = self._owner  # a buffer of another client: refused at the call, O(1) each
        if owner is not None:
            for b in bindings.buffers:
                if b.memory.queue is not owner:
                    _foreign_launch(owner, count, bindings)
            if bindings.tensor_maps or count.binding is not None:
                _foreign_launch(owner, count, bindings)
        if count.binding is not None and channel.guard is not None:
            channel.guard("execute with a dynamic CubeCount")  # its count is read back first
        stream = StreamId.current()
        if count.binding is None and not bindings.tensor_maps:  # its buffers all known
            mids = [b.memory.id for b in bindings.buffers]
            channel.send_tracked(launch, mids, stream, kernel, count, bindings, mode)
        else:
            channel.send(launch, stream, kernel, count, bindings, mode)

    def flush(self) -> None:
        """Submit work buffered for the calling task's stream."""
        self._channel.check()
        self._dispatch.fire(self._server.flush)

    # -- profiling's timeline and numpy helpers (arrays.py) ----------------------------

    async def timeline(self) -> Timeline:
        """The kernels and copies recorded so far, per stream, once queued work is done.

        Records are kept at profiling level ``medium`` or ``full`` (config
        ``[profiling] level`` or ``ASYNCCUBE_PROFILING_LEVEL``). ``timeline.save(path)``
        writes a Chrome trace / Perfetto JSON file; in Jupyter it renders as a plot.
        """
        await self.sync()
        return await self._profiler.timeline(self.device)

    def create_array(self, array: npt.ArrayLike) -> Tensor:
        """A new tensor holding a copy of ``array`` (contiguous layout, the same shape: a
        0-d array makes a 0-d tensor). Its dtype must be one a kernel computes on and
        DLPack exports (numeric or bool, native byte order): others raise
        InvalidArgument naming those."""
        # An ndarray goes as it is (a strided one too): the host server borrows a large
        # one and packs it off the loop; anything else is converted here.
        arr = array if type(array) is np.ndarray else np.asarray(array)
        _numeric_dtype("create_array: dtype", arr.dtype)
        handle = self.create(arr)
        return arrays.create_array(self, handle, arr)

    def empty_array(
        self,
        shape: Sequence[int],
        dtype: npt.DTypeLike,
        kind: AllocationKind = AllocationKind.CONTIGUOUS,
    ) -> Tensor:
        """A new uninitialized tensor of ``shape`` and ``dtype`` (numeric or bool, native
        byte order)."""
        return arrays.empty_array(self, shape, dtype, kind)

    def tensor(
        self,
        handle: Handle,
        shape: Sequence[int],
        dtype: npt.DTypeLike,
        strides: Sequence[int] | None = None,
    ) -> Tensor:
        """A typed view of ``handle`` (C-contiguous unless ``strides``, in elements,
        are given) that exports through DLPack (``np.from_dlpack(view)``). A handle of
        another client raises InvalidHandle; a dtype no kernel computes on,
        InvalidArgument."""
        return arrays.tensor(self, handle, shape, dtype, strides)

    def from_dlpack(self, obj: Any, /, *, device: Any = None, copy: bool | None = None) -> Tensor:
        """A tensor over ``obj``'s memory (a numpy array on the host server; a torch or
        CuPy tensor on the same GPU, whose work is ordered before this task's stream),
        with the array API's keywords: ``copy=False`` shares the memory or raises,
        ``copy=True`` binds a copy made now, ``copy=None`` (default) shares where it
        can and copies where it cannot (read-only or non-contiguous memory);
        ``device`` is None or this client's (``client.device`` or its DLPack tuple).
        Shared memory stays the producer's: the consumed capsule (so the producer's
        memory) and ``obj`` stay alive while the tensor, any view of it, its bindings
        or queued work refer to it, and it never enters the pools. DLPackError names
        what stands in the way (another device, dtype, read-only memory with
        ``copy=False``...)."""
        return arrays.from_dlpack(self, obj, device, copy)

    async def read_array(
        self,
        source: Tensor | Binding | Handle,
        dtype: npt.DTypeLike | None = None,
        shape: Sequence[int] | None = None,
    ) -> npt.NDArray[Any]:
        """Read a tensor (or a buffer, given ``dtype`` and optionally ``shape``) into a
        new numpy array of the right dtype and shape."""
        return await arrays.read_array(self, source, dtype, shape)

    # -- warm-up runs (warmup.py) ---------------------------------------------------------

    def warm_up(self, *, raise_on_failure: bool = True) -> AbstractAsyncContextManager[WarmUpStats]:
        """``async with client.warm_up() as stats:`` compiles and drops the calling
        task's launches on this client (cubecl-runtime's ``DryRun``): each launch is
        checked, its kernel compiled and loaded in worker threads (never on the loop),
        and nothing runs. Creates, writes and reads are real; the buffers a dropped
        launch would have written carry :class:`~asynccube.LaunchDropped`, which a read
        of one raises (never stale bytes), and which the scope absorbs when it ends its
        block. Tuners inside compile every candidate of a key not tuned yet. Other
        tasks' launches run as usual.

        When the block ends, the compiles it started are awaited and ``stats`` (a
        :class:`WarmUpStats`) is final; kernels that failed raise
        :class:`~asynccube.WarmUpError` there unless ``raise_on_failure=False`` (they are
        in ``stats.failures`` either way; nothing is held on a stream). A block that
        raises or is cancelled ends the scope at once (see the services guide).
        """
        if not isinstance(raise_on_failure, bool):
            raise InvalidArgument(
                f"warm_up: raise_on_failure must be a bool, got {raise_on_failure!r}"
            )
        return Scope(self._warm, dropping=True, raise_on_failure=raise_on_failure)

    def tuning(self) -> AbstractAsyncContextManager[WarmUpStats]:
        """``async with client.tuning() as stats:`` runs the calling task's launches and
        makes each tuner call in it tune its key now, a background tuner too, so later
        calls find the pick (the measuring scope: cubecl-runtime's ``RealRun``; inside a
        warm-up it runs launches again). When the block ends, the tuning runs it started
        are done and stored; ``stats`` counts keys tuned, found cached, stored, failed.
        """
        return Scope(self._warm, dropping=False, raise_on_failure=False)

    # -- graphs and other clients ---------------------------------------------------------

    def capture(self) -> AbstractAsyncContextManager[Graph]:
        """``async with client.capture() as graph:`` records the calling task's commands
        (executes, writes, copies) into a graph instead of running them; then
        ``graph.replay()`` runs them (fire-and-forget, ordered like an execute).

        A read, a sync, an allocation that needs a new page and other operations that
        cannot be recorded raise :class:`GraphCaptureError` naming them, and end the
        capture. On CUDA this is a stream capture instantiated once; on the host server
        the command list is kept and run again.
        """
        return capture(self)

    def to_client(self, handle: Handle | Binding, other: ComputeClient) -> Handle:
        """A new handle in ``other`` holding the bytes of ``handle`` (fire-and-forget).

        Between GPUs that reach each other: a peer copy; otherwise staged through
        (pinned) host memory. Ordered on both sides: the copy sees the work queued on
        ``handle`` so far; ``other``'s later work on the new handle sees the copy.
        """
        self._channel.check()
        if not isinstance(other, ComputeClient):
            raise InvalidArgument(f"to_client needs another client, got {type(other).__name__}")
        return to_client(self, handle, other)

    # -- lifecycle ----------------------------------------------------------------------

    async def close(
        self, *, cancel_pending: bool = False, abandon_after: float | None = None
    ) -> None:
        """Finish queued work, release the server, and refuse every later call.

        Raises the first fire-and-forget error nobody awaited (others attached as
        notes), after closing. Closing again is a no-op.

        Args:
            cancel_pending: drop the commands not yet issued to the server (queued
                behind a compile, or past a loop iteration's batch budget); their
                awaitables raise :class:`~asynccube.ClientClosedError`. Work issued
                already (on a GPU's streams, on the host server's worker threads) is
                finished.
            abandon_after: wait at most this many seconds for the issued work
                (``None``: as long as it takes). Past it, the work is abandoned with a
                ``RuntimeWarning``: the awaitables still pending raise
                ``ClientClosedError``, and the server frees its memory once the work
                ends. For a service's shutdown: ``close(cancel_pending=True,
                abandon_after=5)``.

        Raises:
            InvalidArgument: ``cancel_pending`` not a bool, or ``abandon_after`` not a
                number of seconds >= 0.
        """
        await self._lifecycle.close(lambda: release_graphs(self), cancel_pending, abandon_after)

    async def __aenter__(self) -> ComputeClient:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        await close_within(self.close(), exc)

    def __del__(self) -> None:
        lifecycle = getattr(self, "_lifecycle", None)
        if lifecycle is not None:
            warn_unclosed(self, self._channel, lifecycle.opened_at)
