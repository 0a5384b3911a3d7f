"""HostServer: the embedded default server, on numpy, with a worker thread per stream.

Work really is asynchronous: ``execute``, ``write`` and ``read`` are queued on the worker
of the calling task's stream, and cross-stream order is kept by ``MultiStream`` with
host events, exactly as on a device. Tasks hold their bindings until they have run, so a
slice is never reused while a queued task may still touch it.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from ..channel.held import HeldErrors
from ..config.logging import ServerLogger
from ..config.pools import MemoryLayout
from ..errors import InvalidHandle, ProfileError
from ..memory import MemoryConfig, MemoryManagement, MemoryReport
from ..memory.config import with_host_limit
from ..memory.slice import SliceHandle
from ..memory.storage import BytesStorage
from ..memory.table import SliceTable
from ..profiling.records import KernelRecord, KernelRecorder
from ..server.handles import SliceServer
from ..server.host_copies import borrow, dense, source_nbytes
from ..server.layout import check_copy, gather, gather_array, gather_into, scatter
from ..server.protocol import BindingResource, BytesLike, DeviceProperties
from ..stream.multi import MultiStream
from ..values.bindings import Bindings, CubeCount
from ..values.kernel import Kernel
from ..values.stream_id import StreamId
from ..values.types import (
    Binding,
    CopyDescriptor,
    ExecutionMode,
    Handle,
    MemoryAllocationMode,
    MemoryUsage,
    ProfileDuration,
    ProfilingToken,
)
from .foreign import HostForeign
from .interop_wait import wait_for_export
from .kernels import kernel_task
from .profiles import duration, timestamp
from .shutdown import close_workers
from .tasks import completing, guarded, recorded
from .worker import HostBackend, HostCompletion, HostStream

__all__ = ["HostServer"]

_Bound = tuple[SliceHandle, "npt.NDArray[np.uint8]"]
"""What a client handle is bound to: its memory slice and a view of the slice's bytes."""

T = TypeVar("T")
View = npt.NDArray[np.uint8]
_EXTERNAL: Any = None
"""The slice of imported (DLPack) memory: none, it belongs to its producer."""
_ROW_ALIGN = 64


class HostServer(HostForeign, SliceServer[_Bound]):
    """The numpy server. See the module docstring.

    Args:
        max_streams: Worker threads at most (stream index = id mod max_streams).
        memory: Memory pool configuration (default preset if None).
        logger: Per-area logging (streaming, memory).
        recorder: Keeps a record of each kernel and copy (profiling level medium/full).
    """

    row_align = _ROW_ALIGN

    def __init__(
        self,
        *,
        max_streams: int = 8,
        memory: MemoryConfig | None = None,
        logger: ServerLogger | None = None,
        recorder: KernelRecorder | None = None,
    ) -> None:
        self._table: SliceTable[_Bound] = SliceTable()
        memory = with_host_limit(memory)
        self._host_limit = memory.max_allocation
        self._memory: MemoryManagement[View] = self._manager(memory)
        self._backend = HostBackend()
        self._streams: MultiStream[HostStream, threading.Event] = MultiStream(
            self._backend, max_streams, logger if logger is not None else ServerLogger()
        )
        self._profiles: dict[int, HostCompletion[int]] = {}
        self.held_errors = HeldErrors()
        """Errors of queued work, per logical stream (the channel shares this store)."""
        self.recorder = recorder if recorder is not None else KernelRecorder()
        if self.recorder.enabled:
            self._streams.record_wait = self._recorded_wait
        self._tokens = itertools.count(1)
        self._properties = DeviceProperties(
            name="numpy host server",
            kind="host",
            alignment=_ROW_ALIGN,
            max_allocation=self._memory.max_allocation,
            extra={"max_streams": max_streams},
        )

    @property
    def device(self) -> str:
        """``"host"``."""
        return "host"

    @property
    def properties(self) -> DeviceProperties:
        """The host's properties."""
        return self._properties

    # -- allocation ---------------------------------------------------------------

    def _manager(self, memory: MemoryConfig) -> MemoryManagement[View]:
        """The memory manager, over the pages of numpy arrays (a dry run's server has
        one that maps nothing)."""
        return MemoryManagement(BytesStorage(), memory, owner_id=self._table.queue.owner_id)

    def _allocate(self, size: int) -> _Bound:
        memory = self._memory.reserve(size)
        return memory, self._memory.resource(memory, 0, size)

    def _release_dropped(self) -> None:
        self._table.drain(self._forget)

    def _forget(self, handle_id: int, memory: _Bound) -> None:
        self._streams.last_use.pop(handle_id, None)
        self.held_errors.forget(handle_id)

    def staging(self, sizes: Sequence[int], stream: StreamId) -> list[memoryview]:
        """Plain host buffers (host memory is already as fast as it gets); thread-safe."""
        return [memoryview(np.empty(n, np.uint8)) for n in sizes]  # type: ignore[arg-type]

    # -- I/O ------------------------------------------------------------------------

    def snapshot(self, data: Any) -> npt.NDArray[Any] | None:
        """Large data borrowed instead of copied on the loop (the client's hook, called
        for anything but ``bytes`` and staging buffers): the worker copies from it in
        stream order (see :mod:`.copies`); None: the client snapshots it now."""
        return borrow(data)

    def write(self, items: Sequence[tuple[CopyDescriptor, BytesLike]], stream: StreamId) -> None:
        """Queue dense bytes into each tensor, in stream order (the worker copies, from
        a borrowed array too: nothing large is copied on the loop)."""
        jobs = []
        for desc, data in items:
            src: Any = data  # bytes-like, or an array borrowed by ``snapshot``
            if not isinstance(src, np.ndarray):
                src = memoryview(src).cast("B")
            check_copy(desc, source_nbytes(src))
            jobs.append((self._view(desc.binding), desc, src))
        resolved = self._streams.resolve(stream, (d.binding for d, _ in items))

        def run() -> None:
            for view, desc, src in jobs:
                scatter(view, desc, dense(src))

        if self.recorder.enabled:
            nbytes = sum(source_nbytes(src) for _, _, src in jobs)
            run = recorded(run, self.recorder, "write", stream.value, "copy", nbytes)
        written = [d.binding.memory.id for d, _ in items]
        resolved.stream.submit(guarded(run, self.held_errors, stream, "write", written))

    def read(
        self, descriptors: Sequence[CopyDescriptor], stream: StreamId
    ) -> HostCompletion[list[bytes]]:
        """Bytes of each tensor once the stream reaches this point (built on the worker,
        the GIL released while they are filled)."""
        return self._read_with(gather, descriptors, stream)

    def read_arrays(
        self, descriptors: Sequence[CopyDescriptor], stream: StreamId
    ) -> HostCompletion[list[npt.NDArray[np.uint8]]]:
        """Like :meth:`read`, each tensor's bytes in a new writable uint8 array the
        caller owns (``read_array`` returns a view of it: no second copy)."""
        return self._read_with(gather_array, descriptors, stream)

    def read_into(
        self, descriptors: Sequence[CopyDescriptor], outs: Sequence[memoryview], stream: StreamId
    ) -> HostCompletion[None]:
        """Each tensor packed straight into its buffer in ``outs`` by the worker, once
        the stream reaches this point (no other copy)."""
        jobs = []
        for desc, out in zip(descriptors, outs, strict=True):
            check_copy(desc, out.nbytes)
            jobs.append((self._view(desc.binding), desc, np.frombuffer(out, np.uint8)))
        resolved = self._streams.resolve(stream, (d.binding for d in descriptors))

        def run() -> None:
            for view, desc, dst in jobs:
                gather_into(dst, view, desc)

        if self.recorder.enabled:
            nbytes = sum(d.nbytes for d in descriptors)
            run = recorded(run, self.recorder, "read", stream.value, "copy", nbytes)
        read = [d.binding.memory.id for d in descriptors]
        return self._complete_on(resolved.stream, run, read)

    def _read_with(
        self,
        pack: Callable[[View, CopyDescriptor], T],
        descriptors: Sequence[CopyDescriptor],
        stream: StreamId,
    ) -> HostCompletion[list[T]]:
        jobs = []
        for desc in descriptors:
            check_copy(desc)
            jobs.append((self._view(desc.binding), desc))
        resolved = self._streams.resolve(stream, (d.binding for d in descriptors))

        def run() -> list[T]:
            return [pack(v, d) for v, d in jobs]

        if self.recorder.enabled:
            nbytes = sum(d.nbytes for d in descriptors)
            run = recorded(run, self.recorder, "read", stream.value, "copy", nbytes)
        read = [d.binding.memory.id for d in descriptors]
        return self._complete_on(resolved.stream, run, read)

    def get_resource(self, binding: Binding, stream: StreamId) -> HostCompletion[Any]:
        """A writable numpy view of the binding's bytes, once the stream's work is done."""
        view = self._view(binding)
        offset = binding.offset_start or 0
        resolved = self._streams.resolve(stream, (binding,))
        return self._complete_on(
            resolved.stream, lambda: BindingResource(view, offset, binding.size)
        )

    def _view(self, binding: Binding) -> View:
        view = self._table.get(binding)[1]
        start, end = binding.offset_start, binding.offset_end
        if start is None and end is None:
            return view
        first = start or 0
        size = binding.buffer_size - first - (end or 0)
        if size < 0:
            raise InvalidHandle(f"offsets of {binding!r} fall outside its buffer")
        return view[first : first + size]

    def export_view(self, binding: Binding, stream: StreamId) -> View:
        """The bytes of ``binding`` for a CPU consumer (DLPack), once the work queued on
        them has run: the worker of the stream that last used the buffer (every earlier
        use is ordered before that one) is handed its tasks and waited for, briefly
        (``interop_wait``); work still running then is refused with DLPackError rather
        than the event loop being blocked (see :mod:`..interop`)."""
        view = self._view(binding)
        wait_for_export(self._backend, self._streams, binding)
        return view

    def import_view(self, handle: Handle, view: View, stream: StreamId) -> None:
        """Bind ``handle`` to outside memory ``view`` (DLPack import): never from, nor
        returned to, the pools; ``view`` keeps its owner alive while a handle, binding
        or queued task refers to it."""
        cursor = self._streams.resolve(stream, ()).cursor
        self._table.bind(handle.memory.id, (_EXTERNAL, view))
        handle.cursor = cursor
        self._created(handle.memory.id, (stream, cursor))

    def _complete_on(
        self, target: HostStream, fn: Callable[[], T], read: Sequence[int] = ()
    ) -> HostCompletion[T]:
        """Run ``fn`` on ``target`` after its queued work (failing if a buffer it reads,
        memory ids ``read``, is tainted); the channel raises the errors held for the
        calling stream by then with it."""
        done: HostCompletion[T] = HostCompletion()
        target.submit(completing(done, fn, self.held_errors, read))
        return done

    def taint(self, stream: StreamId, bindings: Sequence[Binding], error: BaseException) -> None:
        """Mark ``bindings`` as last written by a command that failed with ``error``
        when it was issued, in stream order (after the work queued before it)."""
        resolved = self._streams.resolve(stream, bindings)
        ids = [b.memory.id for b in bindings]
        held = self.held_errors
        resolved.stream.submit(lambda: held.taint(ids, error))

    # -- execution ------------------------------------------------------------------

    def execute(
        self,
        kernel: Kernel,
        count: CubeCount,
        bindings: Bindings,
        mode: ExecutionMode,
        stream: StreamId,
    ) -> None:
        """Queue ``kernel``'s host function on the stream's worker."""
        run, used = kernel_task(kernel, count, bindings, mode, self._view)
        target = self._streams.resolve(stream, used).stream
        recorder = self.recorder
        if recorder.enabled:
            run = recorded(run, recorder, kernel.id, stream.value, "kernel", None)
        written = [b.memory.id for b in bindings.buffers]
        written += [t.binding.memory.id for t in bindings.tensor_maps]
        bound = written if count.binding is None else [*written, count.binding.memory.id]
        what = f"kernel {kernel.id!r}"
        launch = (kernel.id, bound)  # skipped if one carries a failure, as it would run
        target.submit(guarded(run, self.held_errors, stream, what, written, launch))

    def warm_up_launch(
        self,
        kernel: Kernel,
        count: CubeCount,
        bindings: Bindings,
        mode: ExecutionMode,
        stream: StreamId,
    ) -> None:
        """A launch a warm-up scope drops (``client.warm_up()``): checked as
        :meth:`execute` checks it (the kernel's host part, live bindings, the launch
        limits), never run. numpy needs no compile: nothing to prepare."""
        kernel_task(kernel, count, bindings, mode, self._view)

    def flush(self, stream: StreamId) -> None:
        """Hand the stream's buffered tasks to its worker."""
        self._streams.streams.get(stream).stream.flush()

    def end_batch(self) -> None:
        """Hand every buffered task to its worker (the actor calls this when it yields),
        then release the handles dropped so far: their slices go back to the pools, and
        imported (DLPack) memory to its producer, without waiting for an allocation or a
        memory report (queued tasks hold the bindings they use, so nothing they still
        read or write is let go)."""
        self._backend.flush_dirty()
        self._release_dropped()

    def sync(self, stream: StreamId) -> HostCompletion[None]:
        """Completes when every stream has finished the work queued so far."""
        events = self._streams.flush_all()
        current = self._streams.streams.get(stream).stream

        def wait_all() -> None:
            for event in events:
                event.wait()

        current.submit(wait_all)
        return self._complete_on(current, lambda: None)

    # -- memory ---------------------------------------------------------------------

    def memory_usage(self, stream: StreamId) -> MemoryUsage:
        """Current memory usage."""
        self._release_dropped()
        return self._memory.memory_usage()

    def memory_cleanup(self, stream: StreamId) -> None:
        """Release pages nothing uses."""
        self._release_dropped()
        self._memory.cleanup(True)

    def allocation_mode(self, mode: MemoryAllocationMode, stream: StreamId) -> None:
        """Switch between the auto and persistent pools."""
        self._memory.mode(mode)

    def set_memory_layout(self, layout: MemoryLayout, stream: StreamId) -> None:
        """Empty the pools, give their pages back, and use ``layout`` from now on (the
        client has waited for the queued work); MemoryInUse while buffers are alive."""
        self._release_dropped()
        self._memory.replace(MemoryConfig.from_layout(layout, self._host_limit))
        limit = self._memory.max_allocation
        self._properties = dataclasses.replace(self._properties, max_allocation=limit)

    def _recorded_wait(
        self, target: HostStream, event: threading.Event, stream: StreamId, origin: int
    ) -> None:
        def wait() -> None:
            event.wait()

        target.submit(recorded(wait, self.recorder, f"wait {origin}", stream.value, "wait", None))

    def memory_report(self, stream: StreamId) -> MemoryReport:
        """Usage, pages and peaks of each pool."""
        self._release_dropped()
        return self._memory.report()

    def kernel_records(self, stream: StreamId) -> list[KernelRecord]:
        """The kernels and copies recorded so far (profiling level medium or full)."""
        return self.recorder.records()

    @property
    def memory(self) -> MemoryManagement[View]:
        """The memory manager (for reports)."""
        return self._memory

    # -- profiling ------------------------------------------------------------------

    def start_profile(self, stream: StreamId) -> ProfilingToken:
        """Start a wall-clock profile once all queued work is done."""
        token = ProfilingToken(next(self._tokens))
        self._profiles[token.id] = timestamp(self.sync(stream))
        return token

    def end_profile(
        self, stream: StreamId, token: ProfilingToken
    ) -> HostCompletion[ProfileDuration]:
        """Stop the profile once all queued work is done."""
        start = self._profiles.pop(token.id, None)
        if start is None:
            raise ProfileError(f"{token} was never started or has already ended")
        return duration(start, timestamp(self.sync(stream)))

    # -- shutdown -------------------------------------------------------------------

    def close(self) -> HostCompletion[None]:
        """Finish queued work, stop the workers and free all memory.

        Errors still held by a stream (fire-and-forget work nobody awaited) fail the
        returned completion, so they are not lost.
        """
        return close_workers(self._streams.existing_streams(), self._free)

    def _free(self) -> list[BaseException]:
        """Free the table and the memory (every worker has exited); the errors held."""
        self._table.close()
        self._memory.close()
        return self.held_errors.drain()
