"""The state every part of the CUDA server shares, and the helpers they all use:
binding addresses, completions, the sticky error.

:class:`~.server.CudaServer` is assembled from one class per concern, each a subclass of
:class:`ServerCore`: :class:`~.launch.LaunchOps` (kernels), :class:`~.transfers.TransferOps`
(copies and staging), :class:`~.timing.ProfileOps` (profiling) and
:class:`~.lifecycle.LifecycleOps` (close and teardown).
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..channel.held import HeldErrors
from ..errors import OutOfMemory
from ..memory import MemoryManagement
from ..memory.slice import SliceHandle
from ..profiling.records import KernelRecorder
from ..server.handles import SliceServer
from ..server.protocol import DeviceProperties
from ..values.kernel import CudaSource
from ..values.stream_id import StreamId
from ..values.types import Binding
from .abi import ArgPacker
from .compiler import KernelCompiler
from .completion import CudaCompletion, EventPool, HostFuncNotifier
from .driver import DeviceContext
from .exports import ExportLeases, Gates
from .storage import CudaStorage, PinnedBuffer, PinnedPool
from .streams import CudaBackend, Retirer

__all__ = ["LoadedKernel", "ServerCore"]

T = TypeVar("T")


@dataclass(slots=True)
class LoadedKernel:
    """A compiled, loaded kernel and what is checked before launching it."""

    function: Any
    module: Any
    source: CudaSource
    symbol: str
    max_threads: int
    param_sizes: tuple[int, ...] | None
    checked: set[object] = field(default_factory=set)
    """The argument packs (one per signature) already checked against the kernel."""
    problem: str | None = None
    grid_ok: tuple[int, int, int] | None = None
    """The last grid a CHECKED launch found within the device's limits (checked again
    only when the grid changes: CHECKED then costs one tuple comparison more)."""
    shape: tuple[int, int, int, int] = (0, 0, 0, 0)
    """Block x, y, z and dynamic shared memory bytes, as ``cuLaunchKernel`` takes them."""

    def __post_init__(self) -> None:
        bx, by, bz = self.source.block
        self.shape = (bx, by, bz, self.source.shared_mem_bytes)


class ServerCore(SliceServer[SliceHandle]):
    """Attributes set by :class:`~.server.CudaServer`'s constructor, and shared helpers."""

    _ctx: DeviceContext
    _props: DeviceProperties
    _extra: dict[str, Any]
    _max_grid: tuple[int, int, int]
    _arch: str
    _storage: CudaStorage
    _memory: MemoryManagement[int]
    _events: EventPool
    _timing: EventPool
    _backend: CudaBackend
    _retirer: Retirer
    _pinned: PinnedPool
    _notifier: HostFuncNotifier | None
    _packer: ArgPacker
    _compiler: KernelCompiler
    _kernels: dict[str, LoadedKernel]
    _loads: list[int]
    _loads_lock: threading.Lock
    _counts: dict[int, tuple[int, int, int]]
    _staged: dict[int, tuple[int, object]]
    _addresses: dict[int, tuple[int, int]]
    _launch: Any
    _janitor: ThreadPoolExecutor | None
    _staged_reads: dict[int, PinnedBuffer]
    _small_reads: dict[int, list[PinnedBuffer]]
    _small_writes: dict[int, list[tuple[PinnedBuffer, tuple[StreamId, int]]]]
    _write_spare_bytes: int
    _created_at: dict[int, tuple[StreamId, int]]
    held_errors: HeldErrors
    _profiles: dict[int, Any]
    _tokens: itertools.count[int]
    _zero_copy: int
    sticky: BaseException | None
    closed: bool
    close_hooks: list[Callable[[], None]]
    before_close: list[Callable[[], None]]
    recorder: KernelRecorder
    _timed: deque[Any]
    _epoch_event: Any
    _epoch_ns: int
    _exports: ExportLeases
    _gates: Gates
    _export_stream: Any
    _export_event_handle: int

    @property
    def context(self) -> DeviceContext:
        """The device's primary context (current on the actor's thread)."""
        return self._ctx

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

    def _collect(self) -> None:
        """Park the slices of every handle dropped so far, record the events after their
        last uses, and release what the device has passed (nothing waits)."""
        self._table.drain(self._forget)
        self._retirer.seal()
        self._retirer.poll()

    def _forget(self, handle_id: int, memory: SliceHandle) -> None:
        self._addresses.pop(handle_id, None)
        self.held_errors.forget(handle_id)
        last = self._streams.last_use.pop(handle_id, None)
        created = self._created_at.pop(handle_id, None)
        if last is None or last == created:
            return  # never touched by device work: the slice is free at once
        wrapper = self._streams.streams.get(last[0])
        if wrapper.done >= last[1]:
            return  # a completed sync or read saw the stream pass its last use: free now
        # Held until an event after its last use; a later sync waits for that event too
        # (the stream's cursor is past its done mark, so sync flushes it).
        self._retirer.hold(wrapper.stream, memory)

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

    def _pointers(self, bindings: list[Binding]) -> list[int]:
        """:meth:`_ptr` of each binding, in one loop (a launch's buffers)."""
        addresses = self._addresses
        queue = self._table.queue
        out = []
        for b in bindings:
            token = b.memory
            entry = addresses.get(token.id)
            start = b.offset_start or 0
            if (
                entry is not None
                and token.queue is queue
                and 0 <= start <= b.buffer_size - (b.offset_end or 0) <= entry[1]
            ):
                out.append(entry[0] + start)
            else:
                out.append(self._ptr(b))
        return out

    def _ptr_slow(self, binding: Binding) -> int:
        memory = self._table.get(binding)  # raises InvalidHandle for foreign/freed handles
        size, whole = binding.size, binding.buffer_size
        base = self._memory.resource(memory, 0, whole)
        self._addresses[binding.memory.id] = (base, whole)
        start = binding.offset_start or 0
        if start >= 0 and size >= 0 and start + size <= whole:
            return base + start  # a device address is linear in its offset
        return self._memory.resource(memory, start, size)  # raises, naming the range

    def _complete(
        self, stream: StreamId, streams: Sequence[Any], finalize: Callable[[], T]
    ) -> CudaCompletion[T]:
        """A completion after the work queued on ``streams``."""
        events = [self._events.record(s) for s in streams]

        return self._completion(events, streams[0] if streams else None, finalize)

    def _complete_read(
        self, stream: StreamId, cu_stream: Any, finalize: Callable[[], T]
    ) -> CudaCompletion[T]:
        """:meth:`_complete` for a copy just queued on ``stream``'s backend stream, after
        all its earlier work: once its event is reached without error, the stream is
        marked done up to the copy's cursor, as a completed sync marks it, so the slices
        last used there before it are free at once when dropped (``fast.empty`` takes
        them without a sync)."""
        streams = self._streams
        wrapper = streams.streams.get(stream)
        if wrapper.stream is not cu_stream:  # not that stream's work: no mark
            return self._complete(stream, [cu_stream], finalize)
        marks = [(wrapper, wrapper.cursor)]
        mark_done = streams.mark_done

        def done() -> T:
            mark_done(marks)
            return finalize()

        return self._complete(stream, [cu_stream], done)

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
