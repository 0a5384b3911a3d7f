"""Device storage for MemoryManagement, and a pinned host staging pool.

:class:`CudaStorage` implements the ``ComputeStorage`` protocol of ``_core/memory``: pages
come from a memory pool of the driver's own (``cuMemPoolCreate``), allocated and freed
in stream order (``cuMemAllocFromPoolAsync``/``cuMemFreeAsync``) on a stream that holds
nothing else. Nothing there ever waits for kernels, so neither call blocks for long and
``cuMemFree``'s implicit device-wide synchronization never happens. After an allocation
the storage stream is synchronized (it holds only the allocation, so this returns at
once), which makes the page usable from every stream. The pool's release threshold is
set (by default: keep everything) so that freed pages are not handed back to the driver
at every synchronization; :meth:`CudaStorage.trim` gives them back (``memory_cleanup``).
The memory manager frees a page only when no stream can still use it.
:meth:`CudaStorage.reserve_range` reserves the range of an expandable pool instead
(:mod:`.vmm`: the driver's virtual memory API); the range's id resolves like a page's.

:class:`PinnedPool` hands out page-locked host buffers (``cuMemHostAlloc``) for staging
reads and writes, reused by size class: small ones rounded up to a power of two, large
ones only to a 2 MiB granule (never to a power of two: that is how cupy#7742 and
pytorch#150517 nearly doubled host memory). A buffer freed where the caller would wait
for it (one past the cache's limit, or one given back after its pool closed: a large
read's result kept past its client, dropped on the loop) is freed on the pool's freeing
thread (:class:`_Freer`): ``cuMemFreeHost`` unpins every page and waits for the device
(2.7-4.3 ms for seven reads' results of 1-7 MiB dropped after their client closed, on
an H200; a call-by-call trace of ``test_it_grows_in_place_on_a_gpu``).
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ..errors import MemoryLayoutError, OutOfMemory
from ..memory.storage import StorageHandle, StorageOutOfMemory
from .driver import ALIGNMENT, check, cu, error_from
from .vmm import VirtualRange, vmm_supported

__all__ = ["CudaStorage", "PinnedBuffer", "PinnedPool"]

log = logging.getLogger("asynccube.memory")

_OOM: Final = 2  # CUDA_ERROR_OUT_OF_MEMORY
KEEP_ALL: Final = 2**64 - 1
_RANGE_WAIT: Final = 30.0
"""Seconds the storage's close waits for an expandable range's releases (a broken
context fails them fast; past this, the process's exit reclaims the memory)."""


class CudaStorage:
    """Device pages for ``MemoryManagement``; ``resource()`` is a device pointer (int).

    Args:
        ordinal: The GPU (its context must be current on the calling thread).
        release_threshold: Bytes the pool keeps reserved across synchronizations
            (default: all of them; :meth:`trim` releases them).
        use_pool: Use a stream-ordered memory pool (default: when the device supports
            one); otherwise ``cuMemAlloc``/``cuMemFree``.
    """

    alignment: int = ALIGNMENT

    def __init__(
        self, ordinal: int = 0, *, release_threshold: int = KEEP_ALL, use_pool: bool | None = None
    ) -> None:
        d = cu()
        dev = check(d.cuDeviceGet(ordinal), "cuDeviceGet")
        self.max_alloc: int | None = int(check(d.cuDeviceTotalMem(dev), "cuDeviceTotalMem"))
        attr = d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
        supported = bool(check(d.cuDeviceGetAttribute(attr, dev), "cuDeviceGetAttribute"))
        use = supported if use_pool is None else use_pool
        self._pool = _create_pool(ordinal, release_threshold) if use else None
        flags = int(d.CUstream_flags.CU_STREAM_NON_BLOCKING)
        self._stream = check(d.cuStreamCreate(flags), "cuStreamCreate(storage)")
        self._pages: dict[int, tuple[int, int]] = {}
        self._ranges: dict[int, VirtualRange] = {}
        self._closing: list[VirtualRange] = []
        self._ordinal = ordinal
        self._device = dev
        self._ids = itertools.count(1)
        self.allocated = 0

    def __repr__(self) -> str:
        kind = "pool" if self._pool is not None else "cuMemAlloc"
        return f"CudaStorage({kind}, pages={len(self._pages)}, allocated={self.allocated})"

    def alloc(self, size: int) -> StorageHandle:
        """A new page of ``size`` bytes; :class:`StorageOutOfMemory` when the device is full."""
        ptr = self._raw_alloc(size)
        if ptr % self.alignment:
            self._raw_free(ptr)
            log.debug("device page at %#x is not %d-aligned; padding", ptr, self.alignment)
            base = self._raw_alloc(size + self.alignment)
            ptr = base + (-base % self.alignment)
        else:
            base = ptr
        sid = next(self._ids)
        self._pages[sid] = (base, ptr - base)
        self.allocated += size
        return StorageHandle(sid, 0, size)

    def _raw_alloc(self, size: int) -> int:
        d = cu()
        call = "cuMemAllocFromPoolAsync" if self._pool is not None else "cuMemAlloc"
        if not self._fits(size):  # refused without a failing driver call (sanitizer-clean)
            raise StorageOutOfMemory(size, f"{call}: CUDA_ERROR_OUT_OF_MEMORY") from error_from(
                _OOM, call
            )
        if self._pool is not None:
            err, ptr = d.cuMemAllocFromPoolAsync(size, self._pool, self._stream)
            call = "cuMemAllocFromPoolAsync"
        else:
            err, ptr = d.cuMemAlloc(size)
            call = "cuMemAlloc"
        if err == _OOM:
            raise StorageOutOfMemory(size, f"{call}: CUDA_ERROR_OUT_OF_MEMORY") from error_from(
                err, call
            )
        if err:
            raise error_from(err, call)
        if self._pool is not None:
            check(d.cuStreamSynchronize(self._stream), "cuStreamSynchronize(storage)")
        return int(ptr)

    def _fits(self, size: int) -> bool:
        """False when ``size`` bytes exceed what the device has free plus what the pool
        holds unused (the driver's answer, without asking it to fail)."""
        d = cu()
        err, free, _ = d.cuMemGetInfo()
        if err:
            return True  # let the allocation itself say
        spare = 0
        if self._pool is not None:
            attrs = d.CUmemPool_attribute
            reserved = d.cuMemPoolGetAttribute(
                self._pool, attrs.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT
            )
            used = d.cuMemPoolGetAttribute(self._pool, attrs.CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
            if not reserved[0] and not used[0]:
                spare = max(0, int(reserved[1]) - int(used[1]))
        return size <= int(free) + spare

    def _raw_free(self, ptr: int) -> None:
        d = cu()
        if self._pool is not None:
            check(d.cuMemFreeAsync(ptr, self._stream), "cuMemFreeAsync")
        else:
            check(d.cuMemFree(ptr), "cuMemFree")

    def dealloc(self, storage_id: int) -> None:
        """Free page ``storage_id`` (no stream may still use it); unknown ids are ignored.
        A range's chunks and addresses are freed by its own thread."""
        page = self._pages.pop(storage_id, None)
        rng = self._ranges.pop(storage_id, None)
        if rng is not None:
            rng.close()
            self._closing.append(rng)
        elif page is not None:
            self._raw_free(page[0])

    def reserve_range(self, size: int) -> VirtualRange:
        """An expandable range of ``size`` bytes of addresses, nothing mapped (its id
        resolves like a page's; ``dealloc`` frees it).

        Raises:
            MemoryLayoutError: the device has no virtual memory management.
        """
        if not vmm_supported(self._device):
            raise MemoryLayoutError(
                f"GPU {self._ordinal} does not support the driver's virtual memory API "
                "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0), which the "
                'expandable pool needs; use [memory] pool = "default" on it'
            )
        sid = next(self._ids)
        rng = VirtualRange(self._ordinal, size, sid)
        self._ranges[sid] = rng
        self._pages[sid] = (rng.base, 0)
        return rng

    def resource(self, handle: StorageHandle) -> int:
        """The device address of ``handle``'s first byte."""
        base, skip = self._pages[handle.id]
        return base + skip + handle.offset

    def storage_ids(self) -> Iterator[int]:
        """Ids of the live pages."""
        return iter(list(self._pages))

    def trim(self, keep: int = 0) -> None:
        """Give the pool's unused reserved memory back to the driver, down to ``keep``."""
        if self._pool is not None:
            d = cu()
            check(d.cuStreamSynchronize(self._stream), "cuStreamSynchronize(storage)")
            check(d.cuMemPoolTrimTo(self._pool, keep), "cuMemPoolTrimTo")

    def reserved(self) -> int:
        """Bytes the pool holds from the driver (pages in use included)."""
        if self._pool is None:
            return self.allocated
        d = cu()
        attr = d.CUmemPool_attribute.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT
        return int(check(d.cuMemPoolGetAttribute(self._pool, attr), "cuMemPoolGetAttribute"))

    def close(self) -> None:
        """Free every page and the pool (call once all work using them is done)."""
        for sid in list(self._pages):
            self.dealloc(sid)
        for rng in self._closing:
            rng.wait(_RANGE_WAIT)
        self._closing.clear()
        d = cu()
        if self._stream is not None:
            check(d.cuStreamSynchronize(self._stream), "cuStreamSynchronize(storage)")
            d.cuStreamDestroy(self._stream)
            self._stream = None
        if self._pool is not None:
            d.cuMemPoolDestroy(self._pool)
            self._pool = None


def _create_pool(ordinal: int, release_threshold: int) -> Any:
    d = cu()
    props = d.CUmemPoolProps()
    props.allocType = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = ordinal
    pool = check(d.cuMemPoolCreate(props), "cuMemPoolCreate")
    attr = d.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
    value = d.cuuint64_t(release_threshold)
    check(d.cuMemPoolSetAttribute(pool, attr, value), "cuMemPoolSetAttribute")
    return pool


class PinnedBuffer:
    """A page-locked host buffer from a :class:`PinnedPool`.

    ``view()``/``array()`` keep the buffer alive; once the buffer object and every view
    of it are gone it goes back to its pool, from whatever thread dropped it. An owner
    that knows no view escaped may :meth:`release` it at once instead.

    Attributes:
        ptr: Host address (also usable as a device-visible address for copies).
        size: Bytes requested.
        capacity: Bytes allocated (the size class).
    """

    __slots__ = ("__weakref__", "_pool", "_released", "capacity", "ptr", "size")

    def __init__(self, pool: PinnedPool, ptr: int, size: int, capacity: int) -> None:
        self._pool = pool
        self.ptr = ptr
        self.size = size
        self.capacity = capacity
        self._released = False

    @property
    def __array_interface__(self) -> dict[str, Any]:
        return {"data": (self.ptr, False), "shape": (self.size,), "typestr": "|u1", "version": 3}

    def array(self) -> npt.NDArray[np.uint8]:
        """A writable ``uint8`` array over the buffer (it keeps the buffer alive)."""
        return np.asarray(self)

    def view(self) -> memoryview:
        """A writable memoryview over the buffer (it keeps the buffer alive)."""
        return memoryview(np.asarray(self))  # type: ignore[arg-type]

    def release(self) -> None:
        """Give the buffer back now (no view of it may be used afterwards)."""
        if not self._released:
            self._released = True
            self._pool._give(self.ptr, self.capacity)

    def __del__(self) -> None:
        if not self._released:
            self._released = True
            self._pool._give(self.ptr, self.capacity)


def _next_pow2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


class PinnedPool:
    """Page-locked host buffers, reused by size class.

    Sizes up to ``small_limit`` round up to a power of two (at least ``min_size``);
    larger ones round up to a multiple of ``granule`` only, and a cached large buffer is
    reused for a request at most 1/8 smaller than it. At most ``max_cached`` bytes of
    free buffers are kept; beyond that they are freed.

    Thread-safe: the actor takes buffers on the loop thread, copy workers in theirs, and
    buffers come back from whatever thread drops them. Allocating page-locked memory is
    slow (about 0.7 ms per MiB), so the server calls :meth:`take` on the loop thread only
    for sizes the pool holds (:meth:`try_take`) or small ones.
    """

    def __init__(
        self,
        *,
        small_limit: int = 1 << 20,
        granule: int = 2 << 20,
        min_size: int = 4096,
        max_cached: int = 1 << 30,
    ) -> None:
        self.small_limit = small_limit
        self.granule = granule
        self.min_size = min_size
        self.max_cached = max_cached
        self._free: dict[int, list[int]] = {}
        self._large: list[int] = []  # sorted capacities with a free buffer
        self._returned: deque[tuple[int, int]] = deque()
        self.cached = 0
        self.allocated = 0
        self.closed = False
        self._lock = threading.Lock()
        self._after_last: Callable[[], object] | None = None

    def class_size(self, size: int) -> int:
        """The capacity a request of ``size`` bytes gets."""
        if size <= self.small_limit:
            return max(self.min_size, _next_pow2(size))
        return -(-size // self.granule) * self.granule

    def take(self, size: int) -> PinnedBuffer:
        """A pinned buffer of at least ``size`` bytes (allocated if none is free)."""
        buf = self.try_take(size)
        if buf is not None:
            return buf
        cap = self.class_size(size)
        return PinnedBuffer(self, self._alloc(cap), size, cap)

    def try_take(self, size: int) -> PinnedBuffer | None:
        """A free pinned buffer of at least ``size`` bytes, or None (never allocates)."""
        with self._lock:
            spare = self._drain()
            ptr, cap = self._reuse(self.class_size(size))
        for spare_ptr, spare_cap in spare:  # past the cache's limit: off the taking thread
            _FREER.free(self, spare_ptr, spare_cap)
        return PinnedBuffer(self, ptr, size, cap) if ptr else None

    def warm(self, sizes: list[int]) -> None:
        """Allocate one free buffer of each size now (call it off the loop)."""
        for buf in [self.take(n) for n in sizes]:
            buf.release()

    def _reuse(self, cap: int) -> tuple[int, int]:
        if cap > self.small_limit:
            i = bisect.bisect_left(self._large, cap)
            if i == len(self._large) or self._large[i] > cap + cap // 8:
                return 0, cap
            cap = self._large[i]
        free = self._free.get(cap)
        if not free:
            return 0, cap
        ptr = free.pop()
        self.cached -= cap
        if not free and cap > self.small_limit:
            self._large.remove(cap)
        return ptr, cap

    def _alloc(self, cap: int) -> int:
        d = cu()
        flags = int(d.CU_MEMHOSTALLOC_PORTABLE)
        err, ptr = d.cuMemHostAlloc(cap, flags)
        if err == _OOM and self.cached:
            self.trim()
            err, ptr = d.cuMemHostAlloc(cap, flags)
        if err == _OOM:
            raise OutOfMemory(cap, self.allocated, "pinned host memory (cuMemHostAlloc)")
        if err:
            raise error_from(err, "cuMemHostAlloc")
        with self._lock:
            self.allocated += cap
        return int(ptr)

    def _give(self, ptr: int, cap: int) -> None:
        if self.closed:
            _FREER.free(self, ptr, cap)  # off the dropping thread (the loop, say)
        else:
            self._returned.append((ptr, cap))  # any thread: deque.append is atomic

    def _drain(self) -> list[tuple[int, int]]:
        """Take the returned buffers into the free lists (under ``_lock``); those past
        ``max_cached`` (or of a closed pool) are returned, for the caller to free once it
        released the lock (:meth:`_free_host` takes it: freeing them here hung the
        thread, the loop's when a read wanted a buffer)."""
        spare: list[tuple[int, int]] = []
        while self._returned:
            ptr, cap = self._returned.popleft()
            if self.closed or self.cached + cap > self.max_cached:
                spare.append((ptr, cap))
                continue
            free = self._free.setdefault(cap, [])
            if not free and cap > self.small_limit:
                bisect.insort(self._large, cap)
            free.append(ptr)
            self.cached += cap
        return spare

    def _free_all(self, spare: list[tuple[int, int]]) -> None:
        for ptr, cap in spare:
            self._free_host(ptr, cap)

    def _free_host(self, ptr: int, cap: int) -> None:
        try:
            check(cu().cuMemFreeHost(ptr), "cuMemFreeHost")
        except Exception as exc:  # a finalizer's failure is logged, never raised
            log.debug("could not free pinned buffer %#x: %s", ptr, exc)
        with self._lock:
            self.allocated -= cap
            last = self._after_last if self.closed and self.allocated <= 0 else None
            if last is not None:
                self._after_last = None
        if last is not None:  # on its own thread: releasing a context takes ~60 ms
            _release_later(last)

    def after_last(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` (the context's release) once every buffer of the closed pool is
        freed: now if none is out, else when the last one comes back (from whatever
        thread drops it, ``fn`` on a thread of its own). A read's result over pinned
        memory may outlive its client; the memory must stay mapped until then, and it
        is the context's."""
        with self._lock:
            out = self.allocated > 0
            if out:
                self._after_last = fn
        if not out:
            fn()

    def trim(self) -> None:
        """Free every cached (unused) buffer."""
        with self._lock:
            spare = self._drain()
            free, self._free = self._free, {}
            self._large.clear()
            self.cached = 0
        self._free_all(spare)
        for cap, ptrs in free.items():
            for ptr in ptrs:
                self._free_host(ptr, cap)

    def close(self) -> None:
        """Free the cached buffers; buffers still out are freed when they come back."""
        self.trim()
        self.closed = True


class _Freer:
    """The thread that frees page-locked buffers for their pools (:meth:`free`), started
    at the first one and kept (a daemon: at exit the process gives the memory back).
    Frees run in the order given, each through the pool's ``_free_host`` (its count, and
    the context's release after the last). Once the interpreter is finalizing, or where
    no thread can start, a free runs on the caller's thread, as before."""

    _jobs: deque[tuple[PinnedPool, int, int]]
    _ready: threading.Condition
    _pending: int
    _thread: threading.Thread | None

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start afresh (a forked child: the parent's thread and queue are not its own)."""
        self._jobs = deque()
        self._ready = threading.Condition(threading.Lock())
        self._pending = 0
        self._thread = None

    def free(self, pool: PinnedPool, ptr: int, cap: int) -> None:
        """Free ``pool``'s buffer ``ptr`` (of ``cap`` bytes) on the freeing thread."""
        if not sys.is_finalizing():
            with self._ready:
                self._jobs.append((pool, ptr, cap))
                self._pending += 1
                started = self._thread is not None or self._start()
                self._ready.notify()
            if started:
                return
            with self._ready:  # no thread: the caller frees what is queued
                jobs, self._jobs = list(self._jobs), deque()
                self._pending -= len(jobs)
            for job_pool, job_ptr, job_cap in jobs:
                job_pool._free_host(job_ptr, job_cap)
            return
        pool._free_host(ptr, cap)

    def _start(self) -> bool:
        thread = threading.Thread(target=self._run, name="asynccube-pinned-free", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # "can't create new thread at interpreter shutdown"
            return False
        self._thread = thread
        return True

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._jobs:
                    self._ready.wait()
                pool, ptr, cap = self._jobs.popleft()
            try:
                pool._free_host(ptr, cap)  # logs the driver's failures
            except BaseException as exc:  # the thread serves every pool: it goes on
                log.debug("freeing pinned buffer %#x failed: %s", ptr, exc)
            with self._ready:
                self._pending -= 1
                self._ready.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every free given so far has run; False if ``timeout`` seconds
        passed first (tests)."""
        with self._ready:
            return self._ready.wait_for(lambda: self._pending == 0, timeout)


_FREER: Final = _Freer()
if hasattr(os, "register_at_fork"):  # a forked child has no freeing thread: its own, anew
    os.register_at_fork(after_in_child=_FREER.reset)


def _release_later(fn: Callable[[], object]) -> None:
    """Run ``fn`` on a thread of its own; inline once the interpreter is shutting down
    (a buffer a module kept is freed then, when no thread can start)."""
    if not sys.is_finalizing():
        try:
            threading.Thread(target=_run_quietly, args=(fn,), daemon=True).start()
            return
        except RuntimeError:  # "can't create new thread at interpreter shutdown"
            pass
    _run_quietly(fn)


def _run_quietly(fn: Callable[[], object]) -> None:
    """Run a deferred release from a finalizer's thread: failures are logged."""
    try:
        fn()
    except Exception as exc:
        log.debug("deferred release failed: %s", exc)
