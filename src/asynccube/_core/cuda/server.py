"""CudaServer: the ComputeServer protocol on NVIDIA's driver API (``cuda.bindings``).

Like the host server, it is plain synchronous code run by the actor on the loop thread,
where the device's primary context is current. Nothing here waits for the device:

* streams: one non-blocking CUDA stream per slot of MultiStream's bounded pool (with the
  configured priority), kept in order with each other by events (``cuStreamWaitEvent``);
* memory: one ``MemoryManagement`` over :class:`~.storage.CudaStorage` pages; a dropped
  handle's slice goes back to its pool only once the device has passed the stream
  position of its last use (an event per stream and batch, polled, never waited for);
* copies: through pinned staging buffers (:class:`~.storage.PinnedPool`), as 1D or 2D
  copies (``cuMemcpy2DAsync``) for pitched and strided tensors;
* kernels: compiled by NVRTC and loaded in a worker thread (``prepare``), launched with
  arguments packed once per signature (:mod:`.abi`);
* completions: events (:mod:`.completion`), so reads, syncs and profiles resolve without
  blocking the loop and without Python in a driver thread.

The class is assembled from one module per concern: :mod:`.launch` (kernels),
:mod:`.transfers` (copies and staging), :mod:`.streams` (MultiStream's backend and the
retirer), :mod:`.timing` (profiling), :mod:`.lifecycle` (close), :mod:`.foreign` (other
libraries' streams: ``client.wait``/``after``), over the shared state
and helpers of :mod:`.state`; this module holds construction, memory and sync.

Errors: every ``CUresult`` becomes a :class:`~asynccube.CudaDriverError`. A sticky one
(illegal address, launch failure, ...) makes the channel fail every pending and later
call with it; closing the client then resets the device's primary context
(``cuDevicePrimaryCtxReset``), so that a new client can be opened. That reset destroys
everything in the context, including CuPy's or PyTorch's allocations in this process.
"""

from __future__ import annotations

import _thread
import contextlib
import dataclasses
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final

from ..channel.backend import run_blocking_owned
from ..channel.held import HeldErrors
from ..config.logging import ServerLogger
from ..config.pools import MemoryLayout
from ..errors import CudaDriverError, DeviceError
from ..memory import MemoryConfig, MemoryManagement, MemoryReport
from ..memory.slice import SliceHandle
from ..memory.table import SliceTable
from ..profiling.records import KernelRecorder
from ..server.protocol import DeviceProperties
from ..stream.multi import MultiStream
from ..values.stream_id import StreamId
from ..values.types import MemoryAllocationMode, MemoryUsage
from .abi import ArgPacker
from .compiler import KernelCompiler
from .completion import CudaCompletion, EventPool, HostFuncNotifier
from .driver import DeviceContext, check, cu, device_properties, set_current
from .exports import ExportLeases, Gates
from .fast import fast_launch
from .fast_sync import FastSync
from .foreign import ForeignOps
from .interop import InteropOps
from .launch import WARM_KERNEL, LaunchOps
from .lifecycle import LifecycleOps
from .native.hotpath import hot
from .state import LoadedKernel
from .storage import CudaStorage, PinnedBuffer, PinnedPool
from .streams import CudaBackend, Retirer
from .timing import TimedOp
from .transfers import ZERO_COPY_READ, TransferOps

if TYPE_CHECKING:
    from ..server.settings import Settings

__all__ = ["CudaBackend", "CudaServer", "LoadedKernel", "Retirer", "open_cuda_server"]

_ROW_ALIGN: Final = 256
"""Pitch alignment (bytes) of OPTIMIZED rows."""


class CudaServer(LaunchOps, TransferOps, LifecycleOps, InteropOps, ForeignOps):
    """The CUDA server. See the module docstring.

    Args:
        context: The device's primary context (current on the calling thread).
        properties: The device's properties (looked up if None).
        max_streams: Device streams at most (stream index = id mod max_streams).
        priority: ``"normal"`` or ``"high"`` stream priority.
        memory: Memory pool configuration (default preset if None).
        logger: Per-area logging.
        cache_dir: Kernel cache directory (None: memory cache only).
        zero_copy_read: Reads at least this large return memoryviews of pinned memory.
        recorder: Keeps a record of each kernel and copy, timed by CUDA events around
            it (profiling level medium or full).
    """

    row_align = _ROW_ALIGN

    def __init__(
        self,
        context: DeviceContext,
        *,
        properties: DeviceProperties | None = None,
        max_streams: int = 32,
        priority: str = "normal",
        memory: MemoryConfig | None = None,
        logger: ServerLogger | None = None,
        cache_dir: Any = None,
        zero_copy_read: int = ZERO_COPY_READ,
        recorder: KernelRecorder | None = None,
    ) -> None:
        hot.open_driver()
        self._ctx = context
        self._props = properties or device_properties(context.ordinal)
        self._extra = self._props.extra
        self._max_grid: tuple[int, int, int] = tuple(self._extra["max_grid_dim"])
        self._arch = self._extra["arch"]
        self._table: SliceTable[SliceHandle] = SliceTable()
        self._storage = CudaStorage(context.ordinal)
        self._memory: MemoryManagement[int] = MemoryManagement(
            self._storage, memory, owner_id=self._table.queue.owner_id
        )
        self._memory.before_grow = self._release_dropped
        self._fit_max_allocation()
        self._events = EventPool()
        self._timing = EventPool(int(cu().CUevent_flags.CU_EVENT_BLOCKING_SYNC))
        self._backend = CudaBackend(self._events, _priority(priority))
        self._streams: MultiStream[Any, Any] = MultiStream(
            self._backend, max_streams, logger or ServerLogger()
        )
        self._retirer = Retirer(self._events)
        self._pinned = PinnedPool()
        self._notifier: HostFuncNotifier | None = None
        self._packer = ArgPacker()
        self._compiler = KernelCompiler(cache_dir=cache_dir)
        self._kernels: dict[str, LoadedKernel] = {}
        # Kernel loads queued for a worker thread, and those finished (written by the
        # loop's thread, and under the lock by the workers: the client's job thread, a
        # warm-up scope's); unequal while a load is queued or running.
        self._loads = [0, 0]
        self._loads_lock = threading.Lock()  # finished loads: counted by several workers
        self._counts: dict[int, tuple[int, int, int]] = {}
        self._staged: dict[int, tuple[int, object]] = {}
        self._addresses: dict[int, tuple[int, int]] = {}
        self._launch = hot.launch
        self._janitor: ThreadPoolExecutor | None = None
        self._staged_reads: dict[int, PinnedBuffer] = {}
        self._small_reads: dict[int, list[PinnedBuffer]] = {}
        # FastLaunch.write's staging buffers: size -> [(buffer, stamp of its last copy)]
        self._small_writes: dict[int, list[tuple[PinnedBuffer, tuple[StreamId, int]]]] = {}
        self._write_spare_bytes = 0
        self._created_at: dict[int, tuple[StreamId, int]] = {}
        self.held_errors = HeldErrors()
        """Errors held per logical stream and tainted buffers (the channel uses this
        store; a dropped handle's taint is forgotten here)."""
        self._profiles: dict[int, Any] = {}
        self._tokens = itertools.count(1)
        self._zero_copy = zero_copy_read
        self.sticky: BaseException | None = None
        self.closed = False
        self.close_hooks: list[Callable[[], None]] = []
        """Called first in the close thread (``all_reduce``'s NCCL communicators)."""
        self.before_close: list[Callable[[], None]] = []
        """Called first by ``close()``, on its caller's thread, the loop's (the one-call
        read route's deferred reads go to the route's completion: :mod:`.fast`)."""
        self._exports = ExportLeases()
        self._gates = Gates()
        self._export_stream: Any = None
        self._export_event_handle = 0
        self.recorder = recorder if recorder is not None else KernelRecorder()
        self._timed: deque[TimedOp] = deque()
        self._epoch_event, self._epoch_ns = self._epoch()

    def activate(self) -> None:
        """Make the device's context current on the calling thread if another one is
        (the channel calls it before each command: several clients share one loop)."""
        set_current(self._ctx.context)

    def fast_launcher(self, channel: Any) -> Any:
        """The ``FastLaunch`` that takes a client's common launches in one call
        (:mod:`.fast`); ``ComputeClient.execute`` offers it each launch first."""
        return fast_launch(self, channel)

    def fast_syncer(self, channel: Any) -> FastSync:
        """The ``FastSync`` that settles a client's sync at once when the device is
        done within a few µs (:mod:`.fast_sync`); ``ComputeClient.sync`` offers it first."""
        return FastSync(self, channel)

    def warm(self) -> None:
        """Pay one-off costs now, off the loop: the device pool's first page, pinned
        buffers of the small size classes, the completion notifier, and NVRTC and the
        module loader (their first use loads libraries while holding the GIL for tens of
        milliseconds, which would freeze the loop even from a worker thread)."""
        self._storage.dealloc(self._storage.alloc(2 << 20).id)
        self._pinned.warm([1 << k for k in range(12, 21)])
        self._notifier = HostFuncNotifier()
        self._load(WARM_KERNEL)

    def flush(self, stream: StreamId) -> None:
        """Nothing is buffered: CUDA work is submitted when queued."""
        self._retirer.seal()

    def end_batch(self) -> None:
        """Record the events that release what this batch dropped; release what the
        device has passed."""
        if self.closed:  # the close thread owns the retirer now
            return
        self._collect()

    def sync(self, stream: StreamId) -> CudaCompletion[None]:
        """Completes when every stream has finished the work queued so far. A stream
        whose work is known complete (no launch or copy since a sync that saw it done)
        records no event."""
        self._collect()
        events, marks = self._streams.flush_pending()
        current = self._streams.streams.get(stream).stream
        return self._completion(events, current, lambda: self._streams.mark_done(marks))

    # -- memory ---------------------------------------------------------------------

    def memory_usage(self, stream: StreamId) -> MemoryUsage:
        """Current memory usage."""
        self._collect()
        return self._memory.memory_usage()

    def memory_cleanup(self, stream: StreamId) -> None:
        """Release pages nothing uses; the pools' cached memory is handed back to the
        driver by a helper thread (that takes milliseconds)."""
        self._collect()
        self._memory.cleanup(True)
        if self._janitor is None:
            self._janitor = ThreadPoolExecutor(1, thread_name_prefix="asynccube-janitor")
        self._janitor.submit(self._trim_pools)

    def _trim_pools(self) -> None:
        self._ctx.make_current()
        self._storage.trim()
        self._pinned.trim()

    def allocation_mode(self, mode: MemoryAllocationMode, stream: StreamId) -> None:
        """Switch between the auto and persistent pools."""
        self._memory.mode(mode)

    def memory_report(self, stream: StreamId) -> MemoryReport:
        """Usage, pages and peaks of each device memory pool."""
        self._collect()
        return self._memory.report()

    def set_memory_layout(self, layout: MemoryLayout, stream: StreamId) -> None:
        """Empty the pools, give their pages back to the driver (the driver's pool is
        trimmed by the helper thread), and use ``layout`` from now on (the client has
        waited for the queued work); MemoryInUse while buffers are alive."""
        self._collect()
        self._memory.replace(MemoryConfig.from_layout(layout))
        self._fit_max_allocation()
        if self._janitor is None:
            self._janitor = ThreadPoolExecutor(1, thread_name_prefix="asynccube-janitor")
        self._janitor.submit(self._trim_pools)

    def _fit_max_allocation(self) -> None:
        """The properties' largest allocation: the device's, within the layout's."""
        limit = self._memory.max_allocation
        self._props = dataclasses.replace(self._props, max_allocation=limit)


def _priority(name: str) -> int:
    if str(name) != "high":
        return 0
    _, greatest = check(cu().cuCtxGetStreamPriorityRange(), "cuCtxGetStreamPriorityRange")
    return int(greatest)


async def open_cuda_server(index: int = 0, settings: Settings | None = None) -> CudaServer:
    """Open GPU ``index``. Driver start-up, property queries, the server's construction
    and the warm-up of its pools (each a few milliseconds the first time) run in a worker
    thread; then the context is made current on the loop's thread, where the actor runs.
    A caller cancelled meanwhile (a timeout around ``open_client``, a service shutting
    down during its start-up) gets no server, and the one built for it is closed, not
    left holding the device's context and memory."""
    server = await run_blocking_owned(_build, _abandoned, index, _options(settings))
    server.context.make_current()
    return server


def _abandoned(server: CudaServer) -> None:
    """Close a server whose opener was cancelled, in a thread of its own with the
    server's context current there (this runs on the build's thread or on the loop's,
    whose current context the channel tracks: it is left alone)."""

    def close() -> None:
        server.context.make_current()
        done = server.close()
        done.wait(None)
        done.result()  # a teardown that failed: sys.unraisablehook reports it

    # Not threading.Thread.start(): it waits until the new thread runs, and this may run
    # on the loop (see channel/blocking.py).
    _thread.start_new_thread(close, ())


def _build(index: int, options: dict[str, Any]) -> CudaServer:
    try:
        return _build_once(index, options)
    except CudaDriverError as exc:
        if not exc.sticky:
            raise
    time.sleep(0.2)  # a closed client's teardown may still be releasing the context
    try:
        return _build_once(index, options)
    except CudaDriverError as exc:
        if not exc.sticky:
            raise
        raise DeviceError(
            f"GPU {index} cannot be used again in this process: an earlier sticky error "
            f"left its CUDA context unusable ({exc.name}), and the driver keeps refusing "
            "it after the context was reset. Restart the process to use the GPU again."
        ) from exc


def _build_once(index: int, options: dict[str, Any]) -> CudaServer:
    ctx = DeviceContext.open(index)
    try:
        server = CudaServer(ctx, properties=device_properties(index), **options)
        server.warm()
    except BaseException:
        with contextlib.suppress(Exception):
            ctx.close()
        raise
    return server


def _options(settings: Settings | None) -> dict[str, Any]:
    if settings is None:
        return {}
    config = settings.config
    comp = config.compilation
    return {
        "max_streams": config.streaming.max_streams,
        "priority": str(config.streaming.priority),
        "memory": settings.pool_layout(),
        "logger": settings.logger(),
        "cache_dir": comp.cache_dir if comp.cache else None,
        "recorder": KernelRecorder.from_config(config.profiling),
    }
