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

Errors: every ``CUresult`` becomes a :class:`~asynccube.CudaDriverError`. A sticky one
(illegal address, launch failure, ...) makes the channel fail every pending and later
call with it; closing the client then resets the device's primary context
(``cuDevicePrimaryCtxReset``), so that a new client can be opened. That reset destroys
everything in the context, including CuPy's or PyTorch's allocations in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeVar

import numpy as np

from ..bindings import Bindings, CubeCount
from ..errors import CudaDriverError, DeviceError, InvalidArgument, OutOfMemory, ProfileError
from ..host.layout import check_copy
from ..host.worker import HostCompletion
from ..kernel import CudaSource, Kernel, block_size
from ..logging import ServerLogger
from ..memory import MemoryConfig, MemoryManagement, MemoryReport
from ..memory.slice import SliceHandle
from ..memory.table import SliceTable
from ..profiling import KernelRecord, KernelRecorder, RecordKind
from ..server import BindingResource, BytesLike, DeviceProperties
from ..slice_server import SliceServer
from ..stream.multi import MultiStream
from ..stream_id import StreamId
from ..types import (
    Binding,
    CopyDescriptor,
    ExecutionMode,
    MemoryAllocationMode,
    MemoryUsage,
    ProfileDuration,
    ProfilingToken,
    TimingMethod,
)
from .abi import ArgPacker, Signature
from .compiler import KernelCompiler
from .completion import CudaCompletion, EventPool, HostFuncNotifier
from .copies import CopyPlan, issue_copy, plan_copy
from .driver import (
    DeviceContext,
    check,
    check_ordinal,
    cu,
    device_properties,
    error_from,
    set_current,
)
from .storage import CudaStorage, PinnedBuffer, PinnedPool
from .tma import encode_tensor_map

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = ["CudaBackend", "CudaServer", "open_cuda_server"]

T = TypeVar("T")
_ROW_ALIGN: Final = 256
"""Pitch alignment (bytes) of OPTIMIZED rows."""
ZERO_COPY_READ: Final = 1 << 20
"""Reads of at least this many bytes come back as memoryviews of pinned memory."""
INLINE_BYTES: Final = 1 << 20
"""Pageable data above this size is staged by ``prepare_write``'s worker-thread job."""


class CudaBackend:
    """MultiStream's ``EventStreamBackend`` on CUDA streams and events."""

    def __init__(self, events: EventPool, priority: int) -> None:
        self.events = events
        self.priority = priority
        self.created: list[Any] = []

    def create_stream(self) -> Any:
        """A non-blocking stream with the configured priority."""
        d = cu()
        flags = int(d.CUstream_flags.CU_STREAM_NON_BLOCKING)
        res = d.cuStreamCreateWithPriority(flags, self.priority)
        stream = check(res, "cuStreamCreateWithPriority")
        self.created.append(stream)
        return stream

    def flush(self, stream: Any) -> Any:
        """An event recorded after the stream's work so far."""
        return self.events.record(stream)

    def wait_event(self, stream: Any, event: Any) -> None:
        """Make ``stream`` wait for ``event``; the event is free again at once (the
        wait captured its state)."""
        check(cu().cuStreamWaitEvent(stream, event, 0), "cuStreamWaitEvent")
        self.events.give(event)

    def wait_event_sync(self, event: Any) -> None:
        """Block the calling (helper) thread until ``event``."""
        check(cu().cuEventSynchronize(event), "cuEventSynchronize")


class Retirer:
    """Keeps objects alive until the device has passed where they were last used.

    ``hold(stream, obj)`` parks ``obj``; ``seal()`` (once per actor batch) records one
    event per stream with parked objects; ``poll()`` drops the objects of every event
    already reached. Nothing blocks.
    """

    def __init__(self, events: EventPool) -> None:
        self._events = events
        self._parked: dict[int, tuple[Any, list[object]]] = {}
        self._inflight: dict[int, deque[tuple[Any, list[object]]]] = {}

    def hold(self, stream: Any, obj: object) -> None:
        """Keep ``obj`` until the device passes the work queued on ``stream`` so far."""
        key = int(stream)
        slot = self._parked.get(key)
        if slot is None:
            self._parked[key] = (stream, [obj])
        else:
            slot[1].append(obj)

    def seal(self) -> None:
        """Record an event after the parked objects of each stream."""
        if not self._parked:
            return
        for key, (stream, objs) in self._parked.items():
            event = self._events.record(stream)
            self._inflight.setdefault(key, deque()).append((event, objs))
        self._parked.clear()

    def poll(self) -> int:
        """Drop what the device has passed; return how many groups are still held."""
        query = cu().cuEventQuery
        left = 0
        for queue in self._inflight.values():
            while queue:
                event, objs = queue[0]
                (err,) = query(event)
                if err:
                    break
                queue.popleft()
                objs.clear()
                self._events.give(event)
            left += len(queue)
        return left

    def clear(self) -> None:
        """Drop everything (after the device is idle, or dead)."""
        self._parked.clear()
        self._inflight.clear()


_WARM_KERNEL: Final = Kernel(
    "asynccube_warm_up",
    cuda=CudaSource('extern "C" __global__ void asynccube_warm_up() {}', "asynccube_warm_up"),
)
"""Compiled and loaded when a server opens, to load NVRTC and the module loader."""


@dataclass(frozen=True, slots=True)
class _TimedOp:
    """A recorded operation whose events the device may not have reached yet."""

    name: str
    stream: int
    kind: RecordKind
    queued: int
    start: Any
    end: Any
    nbytes: int | None


@dataclass(slots=True)
class LoadedKernel:
    """A compiled, loaded kernel and what is checked before launching it."""

    function: Any
    module: Any
    source: CudaSource
    symbol: str
    max_threads: int
    param_sizes: tuple[int, ...] | None
    checked: set[tuple[object, ...]] = field(default_factory=set)
    problem: str | None = None


class CudaServer(SliceServer[SliceHandle]):
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
        self._counts: dict[int, tuple[int, int, int]] = {}
        self._staged: dict[int, tuple[int, object]] = {}
        self._addresses: dict[int, tuple[int, int]] = {}
        self._launch = cu().cuLaunchKernel
        self._janitor: ThreadPoolExecutor | None = None
        self._staged_reads: dict[int, PinnedBuffer] = {}
        self._created_at: dict[int, tuple[StreamId, int]] = {}
        self._profiles: dict[int, Any] = {}
        self._tokens = itertools.count(1)
        self._zero_copy = zero_copy_read
        self.sticky: BaseException | None = None
        self.closed = False
        self.recorder = recorder if recorder is not None else KernelRecorder()
        self._timed: deque[_TimedOp] = deque()
        self._epoch_event, self._epoch_ns = self._epoch()

    def _epoch(self) -> tuple[Any, int]:
        stream = self._streams.gc_stream()
        event = self._timing.record(stream)
        check(cu().cuEventSynchronize(event), "cuEventSynchronize(epoch)")
        return event, time.perf_counter_ns()

    @property
    def context(self) -> DeviceContext:
        """The device's primary context (current on the actor's thread)."""
        return self._ctx

    def activate(self) -> None:
        """Make the device's context current on the calling thread if another one is
        (the channel calls it before each command: several clients share one loop)."""
        set_current(self._ctx.context)

    def warm(self) -> None:
        """Pay one-off costs now, off the loop: the device pool's first page, pinned
        buffers of the small size classes, the completion notifier, and NVRTC and the
        module loader (their first use loads libraries while holding the GIL for tens of
        milliseconds, which would freeze the loop even from a worker thread)."""
        self._storage.dealloc(self._storage.alloc(2 << 20).id)
        self._pinned.warm([1 << k for k in range(12, 21)])
        self._notifier = HostFuncNotifier()
        self._load(_WARM_KERNEL)

    @property
    def device(self) -> str:
        """``"cuda:N"``."""
        return f"cuda:{self._ctx.ordinal}"

    @property
    def properties(self) -> DeviceProperties:
        """The GPU's properties (``extra`` holds compute capability, SM count, limits)."""
        return self._props

    @property
    def memory(self) -> MemoryManagement[int]:
        """The memory manager (for reports)."""
        return self._memory

    # -- allocation ---------------------------------------------------------------

    def _created(self, handle_id: int, stamp: tuple[StreamId, int]) -> None:
        super()._created(handle_id, stamp)
        self._created_at[handle_id] = stamp

    def _allocate(self, size: int) -> SliceHandle:
        try:
            return self._memory.reserve(size)
        except OutOfMemory:
            # Slices waiting for the device to pass their last use may be free by now.
            self._retirer.seal()
            if not self._retirer.poll() and not self._table.queue:
                raise
            self._release_dropped()
            return self._memory.reserve(size)

    def _release_dropped(self) -> None:
        self._table.drain(self._forget)
        self._retirer.poll()

    def _forget(self, handle_id: int, memory: SliceHandle) -> None:
        self._addresses.pop(handle_id, None)
        last = self._streams.last_use.pop(handle_id, None)
        created = self._created_at.pop(handle_id, None)
        if last is None or last == created:
            return  # never touched by device work: the slice is free at once
        self._retirer.hold(self._streams.streams.get(last[0]).stream, memory)

    def staging(self, sizes: Sequence[int], stream: StreamId) -> list[memoryview]:
        """Pinned host buffers: writes from them need no extra copy. May run in a worker
        thread (allocating page-locked memory takes milliseconds)."""
        self._ctx.make_current()
        return [self._pinned.take(n).view() for n in sizes]

    def _ptr(self, binding: Binding) -> int:
        """The device address of ``binding``'s first byte (offsets applied, range checked)."""
        token = binding.memory
        entry = self._addresses.get(token.id)
        if entry is None or token.queue is not self._table.queue:
            return self._ptr_slow(binding)
        base, length = entry
        start = binding.offset_start or 0
        end = binding.buffer_size - (binding.offset_end or 0)
        if not 0 <= start <= end <= length:
            return self._ptr_slow(binding)  # raises, naming the range
        return base + start

    def _ptr_slow(self, binding: Binding) -> int:
        memory = self._table.get(binding)  # raises InvalidHandle for foreign/freed handles
        size = binding.size
        base = self._memory.resource(memory, 0, binding.buffer_size)
        self._addresses[binding.memory.id] = (base, binding.buffer_size)
        return self._memory.resource(memory, binding.offset_start or 0, size)

    # -- I/O ------------------------------------------------------------------------

    def write(self, items: Sequence[tuple[CopyDescriptor, BytesLike]], stream: StreamId) -> None:
        """Copy dense bytes into each tensor, in stream order.

        Page-locked data (e.g. from ``staging``) is copied from directly; other data goes
        through a pinned buffer, filled beforehand by :meth:`prepare_write`'s job when
        the client ran it, else here (which blocks the loop for about 0.1 ms per MiB,
        plus 0.7 ms per MiB when no pinned buffer of that size is free).
        """
        self._retirer.poll()  # staging buffers of earlier copies may be free again
        jobs = []
        for desc, data in items:
            mv = memoryview(data).cast("B")
            check_copy(desc, mv.nbytes)
            if mv.nbytes:
                jobs.append((self._ptr(desc.binding), _plan(desc), data, mv))
        resolved = self._streams.resolve(stream, [d.binding for d, _ in items])
        mark = self._mark(resolved.stream) if self.recorder.enabled and jobs else None
        for ptr, plan, data, mv in jobs:
            staged = self._staged.pop(id(data), None)
            src, keep = staged if staged is not None else _stage(self._pinned, mv)
            issue_copy(plan, ptr, src, resolved.stream, to_device=True)
            self._retirer.hold(resolved.stream, keep)
        if mark is not None:
            nbytes = sum(mv.nbytes for _, _, _, mv in jobs)
            self._timed_op(mark, resolved.stream, "write", stream, "copy", nbytes)

    def prepare_write(
        self, items: Sequence[tuple[CopyDescriptor, BytesLike]], stream: StreamId
    ) -> Callable[[], None] | None:
        """A job for a worker thread that stages large pageable data into pinned buffers
        before ``write`` (None: nothing worth moving off the loop). Never raises."""
        big = [data for _, data in items if _nbytes(data) > INLINE_BYTES]
        if not big:
            return None

        def job() -> None:
            self._ctx.make_current()
            for data in big:
                self._staged[id(data)] = _stage(self._pinned, memoryview(data).cast("B"))

        return job

    def read(
        self, descriptors: Sequence[CopyDescriptor], stream: StreamId
    ) -> CudaCompletion[list[Any]]:
        """Each tensor, densely packed: ``bytes``, or a memoryview of pinned memory for
        reads of at least ``zero_copy_read`` bytes (no extra host copy)."""
        self._retirer.poll()
        jobs = []
        total = 0
        for desc in descriptors:
            check_copy(desc)
            jobs.append((self._ptr(desc.binding), _plan(desc), total, desc.nbytes))
            total += desc.nbytes
        resolved = self._streams.resolve(stream, [d.binding for d in descriptors])
        size = max(total, 1)
        buf = self._staged_reads.pop(size, None) or self._pinned.take(size)
        mark = self._mark(resolved.stream) if self.recorder.enabled else None
        for ptr, plan, offset, _ in jobs:
            issue_copy(plan, ptr, buf.ptr + offset, resolved.stream, to_device=False)
        if mark is not None:
            self._timed_op(mark, resolved.stream, "read", stream, "copy", total)
        spans = [(offset, n) for _, _, offset, n in jobs]
        big = total >= self._zero_copy
        return self._complete(stream, [resolved.stream], lambda: _unstage(buf, spans, big))

    def prepare_read(
        self, descriptors: Sequence[CopyDescriptor], stream: StreamId
    ) -> Callable[[], None] | None:
        """A job for a worker thread that allocates the pinned buffer of a large read
        when none of its size is free (None: nothing to do). Never raises."""
        size = sum(_desc_nbytes(d) for d in descriptors)
        if size <= self._pinned.small_limit or size in self._staged_reads:
            return None
        buf = self._pinned.try_take(size)
        if buf is not None:
            self._staged_reads[size] = buf
            return None

        def job() -> None:
            self._ctx.make_current()
            self._staged_reads[size] = self._pinned.take(size)

        return job

    def get_resource(self, binding: Binding, stream: StreamId) -> CudaCompletion[Any]:
        """The device address of the binding's first byte (``offset``: its
        ``offset_start``), once the stream's work is done."""
        ptr = self._ptr(binding)
        offset = binding.offset_start or 0
        resolved = self._streams.resolve(stream, (binding,))
        resource = BindingResource(ptr, offset, binding.size)
        return self._complete(stream, [resolved.stream], lambda: resource)

    def _complete(
        self, stream: StreamId, streams: Sequence[Any], finalize: Callable[[], T]
    ) -> CudaCompletion[T]:
        """A completion after the work queued on ``streams``."""
        events = [self._events.record(s) for s in streams]

        return self._completion(events, streams[0] if streams else None, finalize)

    def _completion(
        self, events: list[Any], stream: Any, finalize: Callable[[], T] | None
    ) -> CudaCompletion[T]:
        if self._notifier is None:
            self._notifier = HostFuncNotifier()
        return CudaCompletion(
            events, finalize, self._events, self._notifier, stream, self._ctx.context,
            on_error=self._note_error,
        )  # fmt: skip

    def _note_error(self, exc: BaseException) -> None:
        if getattr(exc, "sticky", False) and self.sticky is None:
            self.sticky = exc

    # -- execution ------------------------------------------------------------------

    def prepare(
        self, kernel: Kernel, count: CubeCount | None = None, stream: StreamId | None = None
    ) -> Callable[[], None] | None:
        """Blocking work to run in a worker thread before ``execute`` (None: nothing to
        do): compiling and loading a kernel not seen yet, and, given a dynamic ``count``
        and its ``stream``, waiting for the count to be read back. Never raises: errors
        surface from the job or from ``execute``."""
        jobs: list[Callable[[], object]] = []
        if kernel.cuda is not None and kernel.id not in self._kernels:
            jobs.append(lambda: self._load(kernel))
        if count is not None and count.binding is not None and stream is not None:
            try:
                jobs.append(self._prefetch_count(count, stream))
            except Exception:  # execute reads it (and raises) itself
                pass
        if not jobs:
            return None

        def run() -> None:
            for job in jobs:
                job()

        return run

    def _prefetch_count(self, count: CubeCount, stream: StreamId) -> Callable[[], None]:
        binding = count.binding
        assert binding is not None
        if binding.size < 12:
            raise InvalidArgument("dynamic CubeCount too small")
        ptr = self._ptr(binding)
        resolved = self._streams.resolve(stream, (binding,))
        buf = self._pinned.take(12)
        d = cu()
        check(d.cuMemcpyDtoHAsync(buf.ptr, ptr, 12, resolved.stream), "cuMemcpyDtoHAsync")
        event = self._events.record(resolved.stream)

        def wait() -> None:
            self._ctx.make_current()
            check(cu().cuEventSynchronize(event), "cuEventSynchronize(dynamic count)")
            self._counts[id(count)] = struct.unpack("<3I", ctypes.string_at(buf.ptr, 12))
            buf.release()
            self._events.give(event)

        return wait

    def _load(self, kernel: Kernel) -> LoadedKernel:
        self._ctx.make_current()
        src = kernel.cuda_part(self.device)
        compiled = self._compiler.compile(src, self._arch)
        d = cu()
        module = check(d.cuModuleLoadData(compiled.cubin), "cuModuleLoadData")
        function = check(d.cuModuleGetFunction(module, compiled.symbol.encode()))
        if src.shared_mem_bytes > 48 * 1024:
            attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(d.cuFuncSetAttribute(function, attr, src.shared_mem_bytes), "cuFuncSetAttribute")
        loaded = LoadedKernel(
            function, module, src, compiled.symbol, _max_threads(function), _param_sizes(function)
        )
        self._kernels[kernel.id] = loaded
        return loaded

    def execute(
        self,
        kernel: Kernel,
        count: CubeCount,
        bindings: Bindings,
        mode: ExecutionMode,
        stream: StreamId,
    ) -> None:
        """Launch ``kernel`` over ``bindings`` on the stream's CUDA stream."""
        loaded = self._kernels.get(kernel.id)
        if loaded is None:
            if kernel.cuda is None:
                kernel.cuda_part(self.device)  # raises KernelNotSupported
            loaded = self._load(kernel)
        ptr = self._ptr
        pointers = [ptr(b) for b in bindings.buffers]
        maps = [self._encode(t) for t in bindings.tensor_maps] if bindings.tensor_maps else ()
        pack, scalars = self._packer.get(bindings)
        if pack.signature.key not in loaded.checked:
            _check_signature(kernel, loaded, pack.signature)
        if count.binding is None:
            grid = (count.x, count.y, count.z)
            used = bindings.all_bindings() if maps else bindings.buffers
        else:
            grid = self._grid(count, stream)
            used = [*bindings.all_bindings(), count.binding]
        if mode is ExecutionMode.CHECKED:
            self._check_launch(kernel, loaded, grid)
        resolved = self._streams.resolve(stream, used)
        meta = bindings.metadata.data
        params = pack.pack(pointers, scalars, meta if meta.size else None, maps)
        gx, gy, gz = grid
        if not (gx and gy and gz):
            return
        bx, by, bz = loaded.source.block
        mark = self._mark(resolved.stream) if self.recorder.enabled else None
        (err,) = self._launch(
            loaded.function, gx, gy, gz, bx, by, bz, loaded.source.shared_mem_bytes,
            resolved.stream, params, 0,
        )  # fmt: skip
        if err:
            raise error_from(err, f"cuLaunchKernel({kernel.id})")
        if mark is not None:
            self._timed_op(mark, resolved.stream, kernel.id, stream, "kernel", None)

    def _encode(self, tmap: Any) -> bytes:
        return encode_tensor_map(tmap.map, self._ptr(tmap.binding))

    def _grid(self, count: CubeCount, stream: StreamId) -> tuple[int, int, int]:
        """Read a dynamic count (blocks the actor until the stream reaches it)."""
        binding = count.binding
        assert binding is not None
        if binding.size < 12:
            raise InvalidArgument(
                f"a dynamic CubeCount needs 12 bytes (uint32 x, y, z); {binding!r} has "
                f"{binding.size}"
            )
        ready = self._counts.pop(id(count), None)
        if ready is not None:
            return ready
        ptr = self._ptr(binding)
        resolved = self._streams.resolve(stream, (binding,))
        buf = self._pinned.take(12)
        d = cu()
        check(d.cuMemcpyDtoHAsync(buf.ptr, ptr, 12, resolved.stream), "cuMemcpyDtoHAsync")
        check(d.cuStreamSynchronize(resolved.stream), "cuStreamSynchronize(dynamic count)")
        x, y, z = struct.unpack("<3I", ctypes.string_at(buf.ptr, 12))
        buf.release()
        return x, y, z

    def _check_launch(
        self, kernel: Kernel, loaded: LoadedKernel, grid: tuple[int, int, int]
    ) -> None:
        if loaded.problem is None:
            loaded.problem = self._static_problem(loaded)
        mx, my, mz = self._max_grid
        if loaded.problem or grid[0] > mx or grid[1] > my or grid[2] > mz:
            where = f"kernel {kernel.id!r} on {self.device}"
            problem = loaded.problem or f"grid {grid} exceeds {self._max_grid}"
            raise InvalidArgument(f"{where}: {problem}")

    def _static_problem(self, loaded: LoadedKernel) -> str:
        """What is wrong with the kernel's block and shared memory on this device ("")."""
        extra = self._extra
        src = loaded.source
        limit = min(extra["max_threads_per_block"], loaded.max_threads)
        dims = extra["max_block_dim"]
        if block_size(src.block) > limit or any(
            b > m for b, m in zip(src.block, dims, strict=True)
        ):
            return f"block {src.block} exceeds the limits ({limit} threads, dims {dims})"
        smem = extra["max_shared_memory_per_block_optin"]
        if src.shared_mem_bytes > smem:
            return f"{src.shared_mem_bytes} bytes of dynamic shared memory exceed {smem}"
        return ""

    def flush(self, stream: StreamId) -> None:
        """Nothing is buffered: CUDA work is submitted when queued."""
        self._retirer.seal()

    def end_batch(self) -> None:
        """Record the events that release what this batch dropped; release what the
        device has passed."""
        if self.closed:  # the close thread owns the retirer now
            return
        self._retirer.seal()
        self._retirer.poll()

    def sync(self, stream: StreamId) -> CudaCompletion[None]:
        """Completes when every stream has finished the work queued so far."""
        self._retirer.seal()
        events = self._streams.flush_all()
        current = self._streams.streams.get(stream).stream
        return self._completion(events, current, None)

    # -- memory ---------------------------------------------------------------------

    def memory_usage(self, stream: StreamId) -> MemoryUsage:
        """Current memory usage."""
        self._retirer.seal()
        self._release_dropped()
        return self._memory.memory_usage()

    def memory_cleanup(self, stream: StreamId) -> None:
        """Release pages nothing uses; the pools' cached memory is handed back to the
        driver by a helper thread (that takes milliseconds)."""
        self._retirer.seal()
        self._release_dropped()
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
        self._retirer.seal()
        self._release_dropped()
        return self._memory.report()

    # -- profiling ------------------------------------------------------------------

    def _mark(self, cu_stream: Any) -> tuple[int, Any]:
        """When an operation was queued, and an event recorded just before it."""
        return time.perf_counter_ns(), self._timing.record(cu_stream)

    def _timed_op(
        self,
        mark: tuple[int, Any],
        cu_stream: Any,
        name: str,
        stream: StreamId,
        kind: RecordKind,
        nbytes: int | None,
    ) -> None:
        queued, start = mark
        end = self._timing.record(cu_stream)
        self._timed.append(_TimedOp(name, stream.value, kind, queued, start, end, nbytes))

    def kernel_records(self, stream: StreamId) -> list[KernelRecord]:
        """Kernels and copies recorded so far, timed by their CUDA events (those whose
        events the device has not reached yet are added on a later call)."""
        query = cu().cuEventQuery
        while self._timed and query(self._timed[0].end)[0] == 0:
            op = self._timed.popleft()
            start, end = self._since_epoch(op.start), self._since_epoch(op.end)
            self._timing.give(op.start)
            self._timing.give(op.end)
            self.recorder.record(
                op.name, op.stream, op.kind, min(op.queued, start), start, end, op.nbytes
            )
        return self.recorder.records()

    def _barrier(self, stream: StreamId) -> Any:
        """The stream's CUDA stream, made to wait for all work queued on the others."""
        current = self._streams.streams.get(stream)
        for _, wrapper in self._streams.streams.existing():
            if wrapper is not current:
                self._backend.wait_event(current.stream, self._backend.flush(wrapper.stream))
        return current.stream

    def start_profile(self, stream: StreamId) -> ProfilingToken:
        """Start a device-timed profile (after all work queued so far)."""
        token = ProfilingToken(next(self._tokens))
        self._profiles[token.id] = self._timing.record(self._barrier(stream))
        return token

    def end_profile(self, stream: StreamId, token: ProfilingToken) -> CudaCompletion[Any]:
        """End the profile once all work queued so far is done; timed by CUDA events."""
        start = self._profiles.pop(token.id, None)
        if start is None:
            raise ProfileError(f"{token} was never started or has already ended")
        current = self._barrier(stream)
        end = self._timing.record(current)

        def finish() -> ProfileDuration:
            t0 = self._since_epoch(start)
            t1 = self._since_epoch(end)
            self._timing.give(start)
            self._timing.give(end)
            return ProfileDuration(t0, max(t0, t1), TimingMethod.DEVICE)

        done: CudaCompletion[ProfileDuration] = CudaCompletion(
            [end], finish, None, self._notifier, current, self._ctx.context,
            on_error=self._note_error,
        )  # fmt: skip
        return done

    def _since_epoch(self, event: Any) -> int:
        ms = check(cu().cuEventElapsedTime(self._epoch_event, event), "cuEventElapsedTime")
        return self._epoch_ns + round(float(ms) * 1e6)

    # -- shutdown -------------------------------------------------------------------

    def close(self) -> HostCompletion[None]:
        """Finish queued work, then free every resource, in a thread of its own (freeing
        pinned and device memory takes milliseconds). After a sticky error, nothing is
        waited for, and the primary context is reset so that a new client can use the
        device; that destroys everything in it, CuPy's or PyTorch's memory included."""
        done: HostCompletion[None] = HostCompletion()
        if self.closed:
            done.set_result(None)
            return done
        self.closed = True
        events: list[Any] = []
        if self.sticky is None:
            try:
                events = self._streams.flush_all()
            except Exception as exc:
                self._note_error(exc)
        threading.Thread(
            target=self._close_in_thread, args=(events, done), name="asynccube-close", daemon=True
        ).start()
        return done

    def _close_in_thread(self, events: list[Any], done: HostCompletion[None]) -> None:
        try:
            self._ctx.make_current()
            sync = cu().cuEventSynchronize
            for event in events:
                (err,) = sync(event)
                if err:
                    self._note_error(error_from(err, "cuEventSynchronize(close)"))
                    break
            if self._janitor is not None:
                self._janitor.shutdown(wait=True)
            self._teardown(reset=self.sticky is not None)
        except BaseException as exc:
            done.set_error(exc)
            return
        done.set_result(None)

    def _teardown(self, reset: bool) -> None:
        d = cu()
        self._ctx.make_current()
        steps: list[Callable[[], object]] = [
            self._retirer.clear,
            self._table.close,
            self._memory.close,
            self._storage.close,
            self._pinned.close,
            self._events.close,
            self._timing.close,
        ]
        if self._notifier is not None:
            steps.append(self._notifier.close)
        steps += [_bind(d.cuModuleUnload, k.module) for k in self._kernels.values()]
        steps += [_bind(d.cuStreamDestroy, st) for st in self._backend.created]
        if reset:
            steps.append(lambda: d.cuDevicePrimaryCtxReset(self._ctx.device))
        steps.append(self._ctx.close)
        for step in steps:
            try:
                step()
            except Exception:  # a broken context fails most frees: nothing to do about it
                if not reset:
                    raise
        self._kernels.clear()


def _bind(fn: Callable[[Any], object], arg: Any) -> Callable[[], object]:
    return lambda: fn(arg)


def _priority(name: str) -> int:
    if str(name) != "high":
        return 0
    _, greatest = check(cu().cuCtxGetStreamPriorityRange(), "cuCtxGetStreamPriorityRange")
    return int(greatest)


def _plan(desc: CopyDescriptor) -> CopyPlan:
    return plan_copy(desc.shape, desc.strides, desc.elem_size)


def _address(mv: memoryview) -> int:
    return int(np.frombuffer(mv, np.uint8).ctypes.data)


def _is_pinned(addr: int) -> bool:
    d = cu()
    attr = d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    err, kind = d.cuPointerGetAttribute(attr, addr)
    return not err and int(kind) == int(d.CUmemorytype.CU_MEMORYTYPE_HOST)


def _nbytes(data: BytesLike) -> int:
    try:
        return memoryview(data).nbytes
    except TypeError:
        return 0


def _desc_nbytes(desc: CopyDescriptor) -> int:
    try:
        return int(desc.nbytes)
    except Exception:
        return 0


def _stage(pinned: PinnedPool, mv: memoryview) -> tuple[int, object]:
    """``(address, owner)`` of page-locked bytes equal to ``mv``: ``mv`` itself when it
    already is page-locked, else a pinned buffer filled with a copy."""
    addr = _address(mv)
    if _is_pinned(addr):
        return addr, mv
    buf = pinned.take(mv.nbytes)
    ctypes.memmove(buf.ptr, addr, mv.nbytes)
    return buf.ptr, buf


def _unstage(buf: PinnedBuffer, spans: list[tuple[int, int]], big: bool) -> list[Any]:
    if big:
        array = buf.array()
        return [memoryview(array[o : o + n]) for o, n in spans]  # type: ignore[arg-type]
    out = [ctypes.string_at(buf.ptr + o, n) for o, n in spans]
    buf.release()
    return out


def _max_threads(function: Any) -> int:
    d = cu()
    attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
    return int(check(d.cuFuncGetAttribute(attr, function), "cuFuncGetAttribute"))


def _param_sizes(function: Any) -> tuple[int, ...] | None:
    d = cu()
    get = getattr(d, "cuFuncGetParamInfo", None)
    if get is None:
        return None
    sizes = []
    for index in range(1024):
        res = get(function, index)
        if res[0]:
            break
        sizes.append(int(res[2]))
    return tuple(sizes)


def _check_signature(kernel: Kernel, loaded: LoadedKernel, sig: Signature) -> None:
    want = tuple(sig.param_sizes())
    have = loaded.param_sizes
    if have is not None and have != want:
        raise InvalidArgument(
            f"kernel {kernel.id!r} ({loaded.symbol}) takes parameters of {list(have)} bytes, "
            f"but the bindings give {list(want)} ({sig}); see the kernel ABI: buffers, "
            "tensor maps, scalars by dtype, then one metadata struct"
        )
    loaded.checked.add(sig.key)


async def open_cuda_server(index: int = 0, settings: Settings | None = None) -> CudaServer:
    """Open GPU ``index``. Driver start-up, property queries, the server's construction
    and the warm-up of its pools (each a few milliseconds the first time) run in a worker
    thread; then the context is made current on the loop's thread, where the actor runs."""
    loop = asyncio.get_running_loop()
    server = await loop.run_in_executor(None, _build, index, _options(settings))
    server.context.make_current()
    return server


def _build(index: int, options: dict[str, Any]) -> CudaServer:
    check_ordinal(index)
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
