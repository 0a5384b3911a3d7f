"""Copies and staging on the CUDA server: ``write``/``read`` through pinned staging
buffers (:class:`~.storage.PinnedPool`), the worker-thread jobs that stage large data
off the loop (``prepare_write``/``prepare_read``), a large ``read_into``'s copy back
done in a worker thread (``OFF_LOOP_COPY``: the channel's ``OffLoop``), ``staging``
and ``get_resource``.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
from collections.abc import Callable, Sequence
from typing import Any, Final

from ..server.host_copies import BORROW_BYTES
from ..server.layout import check_copy
from ..server.protocol import BindingResource, BytesLike, OffLoop
from ..values.stream_id import StreamId
from ..values.types import Binding, CopyDescriptor
from .completion import CudaCompletion
from .copies import CopyPlan, issue_copy, plan_copy
from .driver import error_from
from .native.hotpath import hot
from .storage import PinnedBuffer, PinnedPool
from .streams import Retirer
from .timing import ProfileOps

__all__ = ["INLINE_BYTES", "SMALL_WRITE", "ZERO_COPY_READ", "TransferOps"]

ZERO_COPY_READ: Final = 1 << 20
"""Reads of at least this many bytes come back as memoryviews of pinned memory."""
INLINE_BYTES: Final = 1 << 20
"""Pageable data above this size is staged by ``prepare_write``'s worker-thread job."""

COPY_SPLIT: Final = 256 << 10
"""Host copies into and out of staging buffers of at least this many bytes go through
``hot.copy_into`` (the GIL released; split over the copy helpers up to 16 MiB, over
threads started for the copy from there): a 1 MiB request body costs the loop thread
about a quarter of its copy where helpers run."""
SNAPSHOT_BYTES: Final = 64 << 10
"""Client data of at least this many bytes (a request body, say) is snapshotted into
pinned memory when a free buffer of its size exists (:meth:`TransferOps.snapshot`): one
host copy where a copy to ``bytes`` and then into a pinned buffer would make two."""
SMALL_READ: Final = 64 << 10
"""Reads up to this many bytes reuse pinned buffers the server keeps per size."""
READ_SPARES: Final = 64
"""Pinned buffers kept per small read size (one per read in flight: deferred reads of
concurrent tasks wait at once), within ``READ_SPARE_BYTES`` a size beyond the first 4."""
READ_SPARE_BYTES: Final = 4 << 20
SMALL_WRITE: Final = 64 << 10
"""Writes of ``bytes`` up to this many bytes may go through ``FastLaunch.write``, which
keeps page-locked staging buffers per size (:meth:`TransferOps.write_spare`)."""
WRITE_SPARES: Final = 64
"""Staging buffers ``FastLaunch.write`` keeps per size (one per write in flight)."""
WRITE_SPARE_BYTES: Final = 16 << 20
"""Bytes of staging buffers ``FastLaunch.write`` keeps in all."""
OFF_LOOP_COPY: Final = 1 << 20
"""A ``read_into`` whose targets are not page-locked copies the staged bytes back in a
worker thread from this many bytes (``read_array``'s new array is such a target): on
the loop, 8 MiB took 1-2 ms on an idle H200 host and 8.8 ms under the GPU suite's load,
past the loop-lag probe's 5 ms; below it the copy is shorter than the thread hop."""


def keeps_read_spare(kept: int, nbytes: int) -> bool:
    """Whether a small read's buffer is kept as a spare of its size beside ``kept``
    others (``READ_SPARES``, ``READ_SPARE_BYTES``; as ``_native_read.c``'s)."""
    return kept < 4 or (kept < READ_SPARES and (kept + 1) * nbytes <= READ_SPARE_BYTES)


def _usable_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


COPY_THREADS: Final = max(1, min(8, os.cpu_count() or 1))
"""Threads a host copy of 16 MiB or more is split over."""
COPY_HELPERS: Final = max(0, min(3, _usable_cores() // 4))
"""Helper threads (the compiled module's, started once; no Python, no GIL) that take
pieces of a host copy of ``COPY_SPLIT`` to 16 MiB beside the calling thread: none with
fewer than 8 cores to run on, where they would take the cores the loop's own work and
the driver's threads need (1 MiB copies 300 µs apart into 64 targets, 3 helpers against
none: 2.4x the time on 2 shared cores, 0.34x on a 32-core H100 host; the notes of
``benchmarks/bench_copy_helpers.py``)."""


class TransferOps(ProfileOps):
    """Data movement between host and device, in stream order."""

    def staging(self, sizes: Sequence[int], stream: StreamId) -> list[memoryview]:
        """Pinned host buffers: writes from them need no extra copy. May run in a worker
        thread (allocating page-locked memory takes milliseconds)."""
        self._ctx.make_current()
        return [self._pinned.take(n).view() for n in sizes]

    # -- I/O ------------------------------------------------------------------------

    def write(self, items: Sequence[tuple[CopyDescriptor, BytesLike]], stream: StreamId) -> None:
        """Copy dense bytes into each tensor, in stream order.

        Page-locked data (e.g. from ``staging``) is copied from directly; other data goes
        through a pinned buffer, filled beforehand by :meth:`prepare_write`'s job when
        the client ran it, else here (which blocks the loop for about 0.1 ms per MiB,
        plus 0.7 ms per MiB when no pinned buffer of that size is free).
        """
        self._retirer.poll()  # staging buffers of earlier copies may be free again
        if len(items) == 1 and self._write_one(*items[0], stream):
            return
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

    def _write_one(self, desc: CopyDescriptor, data: BytesLike, stream: StreamId) -> bool:
        """The common write (``create``'s), one dense 1D range of the data's length, with
        the checks of ``check_copy`` and the copy plan worked out inline, as
        ``_read_one`` does (False before any change: not that case, or not valid; the
        general path handles it, and raises what it raises)."""
        shape, strides, elem = desc.shape, desc.strides, desc.elem_size
        if len(shape) != 1 or len(strides) != 1 or strides[0] != 1 or elem <= 0:
            return False
        nbytes = shape[0] * elem
        binding = desc.binding
        if not 0 < nbytes <= binding.size or self.recorder.enabled:
            return False
        mv = memoryview(data).cast("B")
        if mv.nbytes != nbytes:
            return False
        ptr = self._ptr(binding)
        resolved = self._streams.resolve(stream, [binding])
        cu_stream = resolved.stream
        staged = self._staged.pop(id(data), None)
        spare = self._small_write_buffer(nbytes) if staged is None and type(data) is bytes else None
        if spare is not None:  # staged as FastLaunch.write stages: its spares, kept
            ctypes.memmove(spare.ptr, hot.address(mv), nbytes)
            err = hot.memcpy_async(True, ptr, spare.ptr, nbytes, cu_stream)
            self._small_writes[nbytes].append((spare, (stream, resolved.cursor)))
        else:
            src, keep = staged if staged is not None else _stage(self._pinned, mv)
            err = hot.memcpy_async(True, ptr, src, nbytes, cu_stream)
            self._retirer.hold(cu_stream, keep)
        if err:
            raise error_from(err, "cuMemcpyHtoDAsync")
        return True

    def _small_write_buffer(self, nbytes: int) -> PinnedBuffer | None:
        """A staging buffer for a small write of ``bytes`` from ``FastLaunch.write``'s
        spares (``_small_writes``), as that route takes one: a kept one the device is
        done with (its copy's stamp passed by its stream's done mark), else a new one
        from :meth:`write_spare`; None (the pool and the retirer stage it): a larger
        write, enough spares kept, or a graph capture (its retirer keeps a copy's
        source for as long as the graph). So the route's writes of a size (a warm-up's,
        say: the one-call routes step aside while one is open) leave the spare that the
        one-call write of that size takes, instead of a buffer in the pool's cache."""
        if nbytes > SMALL_WRITE or type(self._retirer) is not Retirer:
            return None
        spares = self._small_writes.get(nbytes)
        if spares:
            slots, max_streams = self._streams.streams.slots, self._streams.max_streams
            for i, (buf, (sid, cursor)) in enumerate(spares[:64]):
                wrapper = slots[sid.value % max_streams]
                if wrapper is not None and wrapper.done >= cursor:
                    del spares[i]
                    return buf
        return self.write_spare(nbytes)

    def read_spare(self, nbytes: int) -> PinnedBuffer | None:
        """A pinned buffer for ``FastLaunch.read`` when every spare of its size is out
        (reads in flight at once), taken as ``_read_small`` takes one; None once the
        server is closing (the route reads)."""
        return None if self.closed else self._pinned.take(nbytes)

    def write_spare(self, nbytes: int) -> PinnedBuffer | None:
        """A new staging buffer of ``nbytes`` for ``FastLaunch.write`` to keep in
        ``_small_writes[nbytes]`` (the list made here), or None when it keeps enough
        (``WRITE_SPARES`` per size, 32 sizes, ``WRITE_SPARE_BYTES`` in all) or the server
        is closing: the route stages that write. Taken as the route's ``_stage`` takes
        one (allocated when the pool has none: small sizes only)."""
        spares = self._small_writes.get(nbytes)
        if spares is None:
            if len(self._small_writes) >= 32:
                return None
            spares = self._small_writes[nbytes] = []
        if len(spares) >= WRITE_SPARES or self.closed:
            return None
        cap = self._pinned.class_size(nbytes)
        if self._write_spare_bytes + cap > WRITE_SPARE_BYTES:
            return None
        buf = self._pinned.take(nbytes)
        self._write_spare_bytes += buf.capacity
        return buf

    def snapshot(self, data: Any) -> memoryview | None:
        """A copy of host data of ``SNAPSHOT_BYTES`` or more taken now, straight into a
        free pinned buffer (one host copy instead of two, split over threads with the
        GIL released; ``write`` then copies from it without staging); else, for data of
        ``BORROW_BYTES`` or more, the data itself, borrowed like on the host server
        (:meth:`prepare_write`'s job copies it into pinned memory in a worker thread, in
        stream order), and page-locked data of that size without a copy at all;
        else None (small or non-contiguous data, or ``bytes``: the client copies it
        itself, or takes ``bytes`` by reference)."""
        if type(data) is bytes:
            return None  # immutable: taken by reference
        try:
            mv = memoryview(data).cast("B")
        except TypeError:
            return None
        if mv.nbytes < SNAPSHOT_BYTES:
            return None
        if mv.nbytes >= BORROW_BYTES and _is_pinned(hot.address(mv)):
            return mv  # page-locked already (torch's pin_memory, say): borrowed, no copy
        buf = self._pinned.try_take(mv.nbytes)
        if buf is None:  # large data is borrowed: prepare_write's job stages it off the loop
            return mv if mv.nbytes >= BORROW_BYTES else None
        if mv.nbytes < COPY_SPLIT:
            ctypes.memmove(buf.ptr, hot.address(mv), mv.nbytes)
        else:
            hot.copy_into(buf.array(), mv, _threads(mv.nbytes))
        return buf.view()[: mv.nbytes]

    def prepare_write(
        self, items: Sequence[tuple[CopyDescriptor, BytesLike]], stream: StreamId
    ) -> Callable[[], None] | None:
        """A job for a worker thread that stages large pageable data into pinned buffers
        before ``write`` (None: nothing worth moving off the loop). Never raises."""
        big = [d for _, d in items if _nbytes(d) > INLINE_BYTES and not _pinned_data(d)]
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
        if len(descriptors) == 1:
            fast = self._read_one(descriptors[0], stream)
            if fast is not None:
                return fast
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
        return self._complete_read(stream, resolved.stream, lambda: _unstage(buf, spans, big))

    def _read_one(self, desc: CopyDescriptor, stream: StreamId) -> CudaCompletion[list[Any]] | None:
        """The common read, one dense 1D range, with the checks of ``check_copy`` and the
        copy plan worked out inline (None: not that case; the general path handles it)."""
        shape, strides, elem = desc.shape, desc.strides, desc.elem_size
        if len(shape) != 1 or len(strides) != 1 or strides[0] != 1 or elem <= 0:
            return None
        nbytes = shape[0] * elem
        binding = desc.binding
        if not 0 < nbytes <= binding.size or self.recorder.enabled:
            return None
        ptr = self._ptr(binding)
        resolved = self._streams.resolve(stream, [binding])
        cu_stream = resolved.stream
        if nbytes <= SMALL_READ:
            return self._read_small(ptr, nbytes, stream, cu_stream)
        buf = self._staged_reads.pop(nbytes, None) or self._pinned.take(nbytes)
        err = hot.memcpy_async(False, ptr, buf.ptr, nbytes, cu_stream)
        if err:
            buf.release()
            raise error_from(err, "cuMemcpyDtoHAsync")
        spans = [(0, nbytes)]
        big = nbytes >= self._zero_copy
        return self._complete_read(stream, cu_stream, lambda: _unstage(buf, spans, big))

    def _read_small(
        self, ptr: int, nbytes: int, stream: StreamId, cu_stream: Any
    ) -> CudaCompletion[list[Any]]:
        """A small read through a pinned buffer the server keeps for reads of that size
        (taken and put back on the loop thread, without the pool's lock)."""
        spare = self._small_reads.get(nbytes)
        buf = spare.pop() if spare else self._pinned.take(nbytes)
        err = hot.memcpy_async(False, ptr, buf.ptr, nbytes, cu_stream)
        if err:
            buf.release()
            raise error_from(err, "cuMemcpyDtoHAsync")

        return self._complete_read(stream, cu_stream, lambda: self.finish_small(buf, nbytes))

    def warm_up_read(self, descriptors: list[CopyDescriptor]) -> None:
        """A read a warm-up pass ended on (its buffer carries ``LaunchDropped``; see
        :mod:`..server.preparation`): nothing is copied, but the page-locked staging a
        read of that size takes is allocated now (``cuMemHostAlloc``, hundreds of µs),
        kept as the spare of its size (which the one-call read route needs) or cached
        by the pinned pool, so the first real read pays none of it. Small reads only
        (``SMALL_READ``): a larger allocation would block the loop."""
        sizes = [math.prod(d.shape) * d.elem_size for d in descriptors]
        total = sum(sizes)
        if self.closed or not 0 < total <= SMALL_READ:  # a larger take would block the loop
            return
        if len(sizes) > 1:
            self._pinned.take(total).release()  # back in the pool, cached for its size class
            return
        kept = self._small_reads.get(total)  # the one-call read route's spare
        if kept is None and len(self._small_reads) < 32:
            kept = self._small_reads[total] = []
        if kept is not None and not kept:
            kept.append(self._pinned.take(total))

    def finish_small(self, buf: PinnedBuffer, nbytes: int) -> list[Any]:
        """The bytes of a finished small read; its buffer kept as a spare (up to 4 per
        size, 32 sizes), else released."""
        out = [ctypes.string_at(buf.ptr, nbytes)]
        kept = self._small_reads.get(nbytes)
        if kept is None and len(self._small_reads) < 32:
            kept = self._small_reads[nbytes] = []
        if kept is not None and keeps_read_spare(len(kept), nbytes) and not self.closed:
            kept.append(buf)
        else:
            buf.release()
        return out

    def read_into(
        self, descriptors: Sequence[CopyDescriptor], outs: Sequence[memoryview], stream: StreamId
    ) -> CudaCompletion[OffLoop[None] | None]:
        """Each tensor, densely packed, into its buffer in ``outs``: copied by the device
        straight into page-locked ones (``staging`` buffers: no host copy at all), and
        into others through one pinned buffer, copied over once the device is done
        (``hot.copy_into``, the GIL released, split over threads from 1 MiB)."""
        self._retirer.poll()
        targets = []
        for desc, out in zip(descriptors, outs, strict=True):
            check_copy(desc, out.nbytes)
            if out.nbytes:
                pinned = _is_pinned(hot.address(out))
                targets.append((self._ptr(desc.binding), _plan(desc), out, pinned))
        resolved = self._streams.resolve(stream, [d.binding for d in descriptors])
        staged = sum(out.nbytes for _, _, out, pinned in targets if not pinned)
        buf = (
            (self._staged_reads.pop(staged, None) or self._pinned.take(staged)) if staged else None
        )
        mark = self._mark(resolved.stream) if self.recorder.enabled else None
        back: list[tuple[int, memoryview]] = []
        try:
            for ptr, plan, out, pinned in targets:
                if pinned:
                    issue_copy(plan, ptr, hot.address(out), resolved.stream, to_device=False)
                    continue
                assert buf is not None
                offset = sum(o.nbytes for _, o in back)
                issue_copy(plan, ptr, buf.ptr + offset, resolved.stream, to_device=False)
                back.append((offset, out))
        except BaseException:
            if buf is not None:
                buf.release()
            raise
        if mark is not None:
            self._timed_op(
                mark, resolved.stream, "read", stream, "copy", sum(o.nbytes for o in outs)
            )
        kept = list(outs)  # the page-locked targets stay alive until the copy is done
        if buf is not None and staged >= OFF_LOOP_COPY:  # copied back in a worker thread
            later = OffLoop(functools.partial(_copy_staged, buf, back, kept), buf.release)
            return self._complete_read(stream, resolved.stream, lambda: later)
        return self._complete_read(stream, resolved.stream, lambda: _copy_back(buf, back, kept))

    def prepare_read_into(
        self, descriptors: Sequence[CopyDescriptor], outs: Sequence[memoryview], stream: StreamId
    ) -> Callable[[], None] | None:
        """:meth:`prepare_read`'s job for the pinned buffer of a ``read_into`` whose
        targets are not page-locked (None: nothing to do). Never raises."""
        try:
            paged = [d for d, o in zip(descriptors, outs, strict=True)
                     if o.nbytes and not _is_pinned(hot.address(o))]  # fmt: skip
        except Exception:  # a bad target: read_into raises for it
            return None
        return self.prepare_read(paged, stream) if paged else None

    def prepare_read(
        self, descriptors: Sequence[CopyDescriptor], stream: StreamId
    ) -> Callable[[], None] | None:
        """A job for a worker thread that allocates the pinned buffer of a read above
        ``SMALL_READ`` when none of its size is free (None: nothing to do). Never raises.
        ``cuMemHostAlloc`` waits for the device to be idle: on the loop, the first read
        of a size while a kernel runs held it for the rest of the kernel (38 ms behind
        a 50 ms kernel, a 128 KiB read on an H200)."""
        if len(descriptors) == 1:
            size = _desc_nbytes(descriptors[0])
        else:
            size = sum(_desc_nbytes(d) for d in descriptors)
        if size <= SMALL_READ or size in self._staged_reads:
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


def _plan(desc: CopyDescriptor) -> CopyPlan:
    return plan_copy(desc.shape, desc.strides, desc.elem_size)


def _pinned_data(data: BytesLike) -> bool:
    """Page-locked bytes (a staging buffer or a snapshot): written without staging."""
    try:
        return _is_pinned(hot.address(data))
    except Exception:  # not a contiguous buffer: the job's staging raises for it
        return False


def _is_pinned(addr: int) -> bool:
    """Page-locked host memory? (``cuPointerGetAttributes``, which answers "not CUDA
    memory" without failing, unlike ``cuPointerGetAttribute``.)"""
    return hot.is_pinned(addr)


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
    addr = hot.address(mv)
    if type(mv.obj) is not bytes and _is_pinned(addr):  # a driver call; bytes never are
        return addr, mv
    buf = pinned.take(mv.nbytes)
    if mv.nbytes < COPY_SPLIT:
        ctypes.memmove(buf.ptr, addr, mv.nbytes)
    else:  # the GIL released, pieces taken by the copy helpers too
        hot.copy_into(buf.array(), mv, _threads(mv.nbytes))
    return buf.ptr, buf


def _threads(nbytes: int) -> int:
    """``hot.copy_into``'s ``threads`` for a copy of ``nbytes``: the calling thread and
    the copy helpers up to 16 MiB, ``COPY_THREADS`` started for the copy from there."""
    return 1 + COPY_HELPERS if nbytes < 16 << 20 else COPY_THREADS


def _copy_back(
    buf: PinnedBuffer | None, back: list[tuple[int, memoryview]], kept: list[memoryview]
) -> None:
    """``read_into``'s end: the staged bytes copied into their targets, the pinned
    buffer released (``kept``: the targets, alive until now)."""
    if buf is None:
        return
    try:
        _copy_staged(buf, back, kept)
    finally:
        buf.release()


def _copy_staged(
    buf: PinnedBuffer, back: list[tuple[int, memoryview]], kept: list[memoryview]
) -> None:
    """The staged bytes copied into their targets (a worker thread runs it from
    ``OFF_LOOP_COPY`` bytes, the buffer released after it on the loop; ``kept``: the
    targets, alive until now)."""
    array = buf.array()
    for offset, out in back:
        n = out.nbytes
        if n >= COPY_SPLIT:
            hot.copy_into(out, array[offset : offset + n], _threads(n))
        else:
            ctypes.memmove(hot.address(out), buf.ptr + offset, n)


def _unstage(buf: PinnedBuffer, spans: list[tuple[int, int]], big: bool) -> list[Any]:
    if big:
        array = buf.array()
        return [memoryview(array[o : o + n]) for o, n in spans]  # type: ignore[arg-type]
    try:  # from 256 KiB the GIL released and the copy helpers joining in
        return [hot.bytes_at(buf.ptr + o, n, _threads(n)) for o, n in spans]
    finally:
        buf.release()
