"""CUDA driver access, storage, pinned staging and completions.

The first tests need no GPU; the ones marked ``cuda`` run where a driver and GPU are.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from asynccube._core.cuda import driver
from asynccube._core.cuda.driver import check, cu, driver_available, error_from
from asynccube._core.cuda.storage import PinnedPool
from asynccube._core.errors import CudaDriverError, DeviceError

MiB = 1 << 20


# ----------------------------------------------------------------- no GPU needed


class _FakeHostAllocs:
    """``cuMemHostAlloc``/``cuMemFreeHost`` over distinct fake addresses."""

    CU_MEMHOSTALLOC_PORTABLE = 1

    def __init__(self) -> None:
        self.next, self.freed = 0x10000, []

    def cuMemHostAlloc(self, size: int, flags: int) -> tuple[int, int]:
        self.next += size
        return 0, self.next

    def cuMemFreeHost(self, ptr: int) -> tuple[int]:
        self.freed.append(ptr)
        return (0,)


def test_buffers_past_the_cache_limit_are_freed_without_hanging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Buffers that come back past ``max_cached`` are freed when the pool next takes
    one; freeing them under the pool's lock (not reentrant) hung the taking thread, the
    loop's when a read wanted a staging buffer (bench_collectives on two H100s)."""
    import threading

    from asynccube._core.cuda import storage

    fake = _FakeHostAllocs()
    monkeypatch.setattr(storage, "cu", lambda: fake)
    monkeypatch.setattr(storage, "check", lambda result, what="": result)
    pool = PinnedPool(max_cached=8192)
    bufs = [pool.take(4096) for _ in range(4)]
    for buf in bufs:
        buf.release()  # four come back; the cache keeps two
    took: list[Any] = []
    worker = threading.Thread(target=lambda: took.append(pool.try_take(4096)), daemon=True)
    worker.start()
    worker.join(5)
    assert not worker.is_alive(), "try_take hung freeing a buffer past the cache limit"
    assert storage._FREER.wait_idle(5)  # freed on the freeing thread, not the taker's
    assert took[0] is not None and len(fake.freed) == 2 and pool.cached == 4096
    took[0].release()
    pool.trim()
    assert len(fake.freed) == 4 and pool.cached == 0


def test_buffers_given_back_after_close_are_freed_off_the_dropping_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A buffer that comes back after its pool closed (a read's result kept past its
    client, dropped on the loop) and buffers past the cache's limit are freed on the
    freeing thread: ``cuMemFreeHost`` waits for the device, milliseconds on the loop.
    The context's release still runs after the last one."""
    import threading

    from asynccube._core.cuda import storage

    fake = _FakeHostAllocs()
    threads: list[int] = []
    free = fake.cuMemFreeHost
    fake.cuMemFreeHost = lambda ptr: (threads.append(threading.get_ident()), free(ptr))[1]  # type: ignore[method-assign]
    monkeypatch.setattr(storage, "cu", lambda: fake)
    monkeypatch.setattr(storage, "check", lambda result, what="": result)
    pool = PinnedPool(max_cached=4096)
    kept = [pool.take(4096) for _ in range(3)]
    kept.pop().release()
    kept.pop().release()  # past the limit: freed when the pool next takes one
    again = pool.try_take(4096)
    assert again is not None
    assert storage._FREER.wait_idle(5) and len(fake.freed) == 1
    released: list[int] = []
    pool.close()
    pool.after_last(lambda: released.append(threading.get_ident()))
    del again
    assert not released  # one still out
    kept.clear()  # the last: dropped here, freed there, then the release
    assert storage._FREER.wait_idle(5)
    assert len(fake.freed) == 3 and pool.allocated == 0
    for _ in range(500):
        if released:
            break
        threading.Event().wait(0.01)
    assert released and threading.get_ident() not in threads + released


class _Handle:
    """A driver handle as cuda.bindings gives it: a new object per call, its value by int()."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __int__(self) -> int:
        return self.value


class _FakeContexts:
    """``cuDevicePrimaryCtxRetain`` returning a new object for the one primary context of
    each device, as cuda.bindings does; counts ``cuCtxSetCurrent``."""

    def __init__(self) -> None:
        self.set_current = 0

    def cuInit(self, flags: int) -> tuple[int]:
        return (0,)

    def cuDeviceGetCount(self) -> tuple[int, int]:
        return 0, 2

    def cuDeviceGet(self, ordinal: int) -> tuple[int, int]:
        return 0, ordinal

    def cuDevicePrimaryCtxRetain(self, dev: int) -> tuple[int, _Handle]:
        return 0, _Handle(0x7000 + dev)

    def cuCtxSetCurrent(self, ctx: Any) -> tuple[int]:
        self.set_current += 1
        return (0,)


def test_clients_of_one_gpu_share_its_context_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two opens of one device's primary context give one object (set_current and the
    one-call routes compare objects): taking turns between them makes no
    ``cuCtxSetCurrent``; another device's context still does."""
    fake = _FakeContexts()
    monkeypatch.setattr(driver, "_module", fake)
    monkeypatch.setattr(driver, "_primary", {})
    monkeypatch.setattr(driver, "_tls", __import__("threading").local())
    a, b, other = (driver.DeviceContext.open(i) for i in (0, 0, 1))
    assert a.context is b.context and other.context is not a.context
    made = fake.set_current
    for _ in range(3):
        driver.set_current(a.context)
        driver.set_current(b.context)
    assert fake.set_current == made + 1  # only back from the other device's, once
    driver.set_current(other.context)
    assert fake.set_current == made + 2
    driver.forget_primary(a.context)  # reset: the next open gets a new object
    again = driver.DeviceContext.open(0)
    assert again.context is not a.context and int(again.context) == int(a.context)


def test_driver_available_never_raises() -> None:
    ok, reason = driver_available()
    assert isinstance(ok, bool)
    assert ok or reason


def test_error_from_names_and_stickiness() -> None:
    err = error_from(700, "cuLaunchKernel")
    assert isinstance(err, DeviceError)
    assert (err.code, err.name, err.sticky, err.call) == (
        700,
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        True,
        "cuLaunchKernel",
    )
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in str(err)
    assert "cuLaunchKernel" in str(err)
    oom = error_from(2, "cuMemAlloc")
    assert (oom.name, oom.sticky) == ("CUDA_ERROR_OUT_OF_MEMORY", False)
    assert error_from(719).sticky


def test_check_unpacks_results() -> None:
    ok = cu().CUresult.CUDA_SUCCESS
    assert check((ok,)) is None
    assert check((ok, 5)) == 5
    assert check((ok, 5, 6)) == (5, 6)
    with pytest.raises(CudaDriverError, match="CUDA_ERROR_INVALID_VALUE"):
        check((cu().CUresult.CUDA_ERROR_INVALID_VALUE,), "cuThing")


def test_pinned_size_classes_never_double_large_buffers() -> None:
    pool = PinnedPool()
    assert pool.class_size(1) == 4096
    assert pool.class_size(5000) == 8192
    assert pool.class_size(MiB) == MiB
    assert pool.class_size(MiB + 1) == 2 * MiB
    assert pool.class_size(257 * MiB) == 258 * MiB
    assert pool.class_size(256 * MiB) == 256 * MiB


# ----------------------------------------------------------------- GPU


@pytest.fixture(scope="module")
def gpu() -> Iterator[driver.DeviceContext]:
    ctx = driver.DeviceContext.open(0)
    yield ctx
    ctx.make_current()
    ctx.close()


@pytest.fixture
def stream(gpu: driver.DeviceContext) -> Iterator[Any]:
    gpu.make_current()
    d = cu()
    s = check(d.cuStreamCreate(int(d.CUstream_flags.CU_STREAM_NON_BLOCKING)))
    yield s
    gpu.make_current()
    check(d.cuStreamSynchronize(s))
    d.cuStreamDestroy(s)


@pytest.mark.cuda
def test_device_properties(gpu: driver.DeviceContext) -> None:
    props = driver.device_properties(0)
    assert props.kind == "cuda"
    assert props.alignment == 512
    assert props.name
    extra = props.extra
    assert extra["sm_count"] > 0
    assert extra["max_threads_per_block"] >= 512
    assert len(extra["max_grid_dim"]) == 3
    assert extra["max_grid_dim"][0] >= 2**31 - 1
    assert extra["arch"].startswith("sm_")
    assert props.max_allocation == extra["total_memory"] > 0
    assert driver.list_devices()[0].startswith("cuda:0  ")


@pytest.mark.cuda
def test_storage_pages_are_aligned_usable_and_freed(gpu: driver.DeviceContext) -> None:
    from asynccube._core.cuda.storage import CudaStorage

    st = CudaStorage(0)
    handles = [st.alloc(size) for size in (1, 1000, MiB, 3 * MiB + 5)]
    for h in handles:
        ptr = st.resource(h)
        assert ptr % 512 == 0
        check(cu().cuMemsetD8(ptr, 0xAB, h.size))
    sub = handles[2].sub(4096, 16)
    assert st.resource(sub) == st.resource(handles[2]) + 4096
    assert sorted(st.storage_ids()) == [h.id for h in handles]
    for h in handles:
        st.dealloc(h.id)
    st.dealloc(12345)
    assert list(st.storage_ids()) == []
    st.trim()
    st.close()


@pytest.mark.cuda
def test_storage_out_of_memory(gpu: driver.DeviceContext) -> None:
    from asynccube._core.cuda.storage import CudaStorage
    from asynccube._core.memory.storage import StorageOutOfMemory

    st = CudaStorage(0)
    assert st.max_alloc is not None
    with pytest.raises(StorageOutOfMemory) as info:
        st.alloc(st.max_alloc * 4)
    assert info.value.size == st.max_alloc * 4
    assert isinstance(info.value.__cause__, CudaDriverError)
    st.close()


@pytest.mark.cuda
def test_pinned_pool_reuses_and_round_trips(gpu: driver.DeviceContext, stream: Any) -> None:
    from asynccube._core.cuda.storage import CudaStorage

    pool = PinnedPool()
    buf = pool.take(3 * MiB)
    ptr, cap = buf.ptr, buf.capacity
    arr = buf.array()
    arr[:] = np.arange(arr.size, dtype=np.uint8)
    st = CudaStorage(0)
    dev = st.resource(st.alloc(3 * MiB))
    d = cu()
    check(d.cuMemcpyHtoDAsync(dev, buf.ptr, buf.size, stream))
    back = pool.take(3 * MiB)
    check(d.cuMemcpyDtoHAsync(back.ptr, dev, back.size, stream))
    check(d.cuStreamSynchronize(stream))
    assert np.array_equal(back.array(), arr)
    del arr, buf
    again = pool.take(3 * MiB - 100)
    assert (again.ptr, again.capacity) == (ptr, cap)
    view = again.view()
    del again
    assert pool.cached == 0  # the view keeps it out
    del view
    small = pool.take(1)
    assert pool.cached == cap  # the view is gone: the 3 MiB buffer is back
    small_ptr = small.ptr
    small.release()
    assert pool.take(2).ptr == small_ptr
    back.release()
    pool.close()
    st.close()


def _completion(stream: Any, ctx: driver.DeviceContext, seconds: float) -> Any:
    from asynccube._core.cuda.completion import CudaCompletion, EventPool, HostFuncNotifier

    from .test_cuda_launch import spin

    spin(stream, seconds)
    events = EventPool()
    ev = events.record(stream)
    return CudaCompletion([ev], lambda: "done", events, HostFuncNotifier(), stream, ctx.context)


@pytest.mark.cuda
def test_completion_done_wait_result(gpu: driver.DeviceContext, stream: Any) -> None:
    c = _completion(stream, gpu, 0.05)
    assert not c.done()
    assert c.wait(0.001) is False
    assert c.wait(None) is True
    assert c.done()
    assert c.result() == "done"


@pytest.mark.cuda
@pytest.mark.asyncio
async def test_completion_fileno_wakes_the_loop(gpu: driver.DeviceContext, stream: Any) -> None:
    gpu.make_current()
    start = time.perf_counter()  # before the 50 ms kernel is launched (slow under a sanitizer)
    c = _completion(stream, gpu, 0.05)
    loop = asyncio.get_running_loop()
    woke = loop.create_future()
    fd = c.fileno()
    assert fd >= 0
    assert c.fileno() == fd
    loop.add_reader(fd, lambda: woke.done() or woke.set_result(time.perf_counter()))
    try:
        at = await asyncio.wait_for(woke, 5)
    finally:
        loop.remove_reader(fd)
    assert c.done()
    assert 0.04 < at - start < 1.0
    assert c.result() == "done"
