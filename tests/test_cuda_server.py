"""The CUDA server through the client: what the shared client suite does not cover.

Every test needs a GPU (marker ``cuda``); the shared suite (test_client.py and others)
also runs on ``cuda:0`` where a GPU is present.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest
import pytest_asyncio

import asynccube as ac
from asynccube._core.values.bindings import TensorMapBinding, TensorMapMeta, TiledFormat

from .kernels import ADD, add_bindings, blocks
from .tasks import actor_idle

pytestmark = [pytest.mark.cuda, pytest.mark.asyncio]

SPIN = ac.Kernel(
    "test_cuda_spin",
    cuda=ac.CudaSource(
        r"""
        extern "C" __global__ void spin(unsigned long long ns) {
            unsigned long long t0, t;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
            do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
        }
        """,
        entry="spin",
        block=(1, 1, 1),
    ),
)

FILL_META = ac.Kernel(
    "test_cuda_fill_meta",
    cuda=ac.CudaSource(
        r"""
        #include <asynccube.h>
        extern "C" __global__ void fill(unsigned int* out, unsigned int base,
                                        ac_metadata<2> meta) {
            unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < meta.v[0]) out[i] = base + meta.v[1] * i;
        }
        """,
        entry="fill",
        block=(64, 1, 1),
    ),
)

TMA_COPY = ac.Kernel(
    "test_cuda_tma_tile_copy",
    cuda=ac.CudaSource(
        r"""
        #include <asynccube.h>
        extern "C" __global__ void tma_copy(float* out,
                                            const __grid_constant__ ac_tensor_map tmap,
                                            unsigned int width) {
            __shared__ __align__(128) float tile[8][16];
            __shared__ __align__(8) unsigned long long bar;
            unsigned int bar_addr = (unsigned int)__cvta_generic_to_shared(&bar);
            unsigned int tile_addr = (unsigned int)__cvta_generic_to_shared(&tile[0][0]);
            int x0 = blockIdx.x * 16, y0 = blockIdx.y * 8;
            if (threadIdx.x == 0) {
                asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bar_addr));
                asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                             :: "r"(bar_addr), "r"(16 * 8 * 4) : "memory");
                asm volatile(
                    "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                    " [%0], [%1, {%2, %3}], [%4];"
                    :: "r"(tile_addr), "l"((unsigned long long)&tmap), "r"(x0), "r"(y0),
                       "r"(bar_addr) : "memory");
            }
            asm volatile(
                "{\n"
                ".reg .pred P1;\n"
                "LAB_WAIT:\n"
                "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
                "@P1 bra DONE;\n"
                "bra LAB_WAIT;\n"
                "DONE:\n"
                "}\n" :: "r"(bar_addr), "r"(0) : "memory");
            int r = threadIdx.x / 16, c = threadIdx.x % 16;
            out[(y0 + r) * width + x0 + c] = tile[r][c];
        }
        """,
        entry="tma_copy",
        block=(128, 1, 1),
    ),
)


@pytest_asyncio.fixture
async def gpu() -> AsyncIterator[ac.ComputeClient]:
    c = await ac.connect("cuda:0")
    yield c
    if not c.closed:
        await c.close()


def spin_bindings(seconds: float) -> ac.Bindings:
    return ac.Bindings().with_scalar(np.uint64, [int(seconds * 1e9)])


async def test_properties_describe_the_gpu(gpu: ac.ComputeClient) -> None:
    props = gpu.properties
    assert props.kind == "cuda" and props.alignment == 512
    assert props.extra["arch"].startswith("sm_") and props.extra["sm_count"] > 0


async def test_add_large_and_zero_copy_read(gpu: ac.ComputeClient) -> None:
    n = 1 << 18  # 1 MiB: the zero-copy size, and the largest pinned size kept warm
    a = np.arange(n, dtype=np.float32)  # cheap to make: the loop-lag probe is running
    b = a * np.float32(0.5)
    ha, hb, out = gpu.create(a), gpu.create(b), gpu.empty(4 * n)
    gpu.execute(ADD, blocks(n), add_bindings(ha, hb, out, n))
    (raw,) = await gpu.read([out])
    assert isinstance(raw, memoryview)  # pinned memory, no extra copy
    assert np.array_equal(np.frombuffer(raw, np.float32), a + b)


async def test_write_from_staging_buffer(gpu: ac.ComputeClient) -> None:
    h = gpu.empty(4096)
    (stage,) = gpu.server.staging([4096], ac.StreamId.current())
    np.frombuffer(stage, np.uint8)[:] = np.arange(4096) % 251
    gpu.write([(h.copy_descriptor((4096,), (1,), 1), stage)])
    assert await gpu.read([h]) == [(np.arange(4096) % 251).astype(np.uint8).tobytes()]


async def test_pitched_tensors_and_strided_io(gpu: ac.ComputeClient) -> None:
    ((h, strides),) = gpu.empty_tensors([(5, 33)], [4])
    assert strides[0] * 4 % 256 == 0
    data = np.arange(5 * 33, dtype=np.float32).reshape(5, 33)
    gpu.write([(h.copy_descriptor((5, 33), strides, 4), data)])
    (raw,) = await gpu.read_tensor([h.copy_descriptor((5, 33), strides, 4)])
    np.testing.assert_array_equal(np.frombuffer(raw, np.float32).reshape(5, 33), data)
    (cols,) = await gpu.read_tensor([h.copy_descriptor((33, 5), (1, strides[0]), 4)])
    np.testing.assert_array_equal(np.frombuffer(cols, np.float32).reshape(33, 5), data.T)
    (every_other,) = await gpu.read_tensor([h.copy_descriptor((5, 17), (strides[0], 2), 4)])
    np.testing.assert_array_equal(
        np.frombuffer(every_other, np.float32).reshape(5, 17), data[:, ::2]
    )


async def test_metadata_and_dynamic_count(gpu: ac.ComputeClient) -> None:
    out = gpu.empty(4 * 200)
    count = gpu.create(np.array([4, 1, 1], np.uint32))
    bindings = (
        ac.Bindings()
        .with_buffer(out)
        .with_scalar(np.uint32, [1000])
        .with_metadata(ac.MetadataBinding([200, 3]))
    )
    gpu.execute(FILL_META, ac.CubeCount.dynamic(count), bindings)
    (raw,) = await gpu.read([out])
    got = np.frombuffer(raw, np.uint32)
    np.testing.assert_array_equal(got[:200], 1000 + 3 * np.arange(200))


async def test_checked_mode_rejects_bad_launches(gpu: ac.ComputeClient) -> None:
    h = gpu.empty(16)
    big = ac.Kernel("test_cuda_big_block", cuda=ac.CudaSource(ADD.cuda.source, "add", (2048, 1, 1)))  # type: ignore[union-attr]
    gpu.execute(big, ac.CubeCount(1), add_bindings(h, h, h, 4))
    with pytest.raises(ac.InvalidArgument, match="block"):
        await gpu.sync()
    gpu.execute(ADD, ac.CubeCount(1), ac.Bindings().with_buffer(h))  # h carries: skipped
    await gpu.sync()  # a skip is no new error (and a skipped launch is not checked)
    h = gpu.empty(16)
    gpu.execute(ADD, ac.CubeCount(1), ac.Bindings().with_buffer(h))  # 1 parameter, not 4
    with pytest.raises(ac.InvalidArgument, match="parameters"):
        await gpu.sync()
    h = gpu.empty(16)
    gpu.execute(ADD, ac.CubeCount(2**31), add_bindings(h, h, h, 4))
    with pytest.raises(ac.InvalidArgument, match="grid"):
        await gpu.sync()


async def test_compile_error_is_held_for_the_stream(gpu: ac.ComputeClient) -> None:
    broken = ac.Kernel("test_cuda_broken", cuda=ac.CudaSource("this is not C++", "k"))
    gpu.execute(broken, ac.CubeCount(1), ac.Bindings())
    with pytest.raises(ac.CompilationError) as info:
        await gpu.sync()
    assert info.value.log


async def test_tensor_map_tile_copy(gpu: ac.ComputeClient) -> None:
    if gpu.properties.extra["compute_capability"] < (9, 0):
        pytest.skip("TMA needs compute capability 9.0")
    width, height = 64, 32
    src = np.random.default_rng(5).standard_normal((height, width)).astype(np.float32)
    hs, out = gpu.create(src), gpu.empty(src.nbytes)
    meta = TensorMapMeta(
        TiledFormat((16, 8)), 2, (width, height), (1, width), (1, 1), np.dtype(np.float32)
    )
    bindings = (
        ac.Bindings()
        .with_buffer(out)
        .with_tensor_maps([TensorMapBinding(hs.binding(), meta)])
        .with_scalar(np.uint32, [width])
    )
    gpu.execute(TMA_COPY, ac.CubeCount(width // 16, height // 8), bindings)
    (raw,) = await gpu.read([out])
    np.testing.assert_array_equal(np.frombuffer(raw, np.float32).reshape(height, width), src)


@pytest.mark.allow_loop_lag  # mapping tens of GB into the pool takes ~1 ms per GiB
async def test_out_of_memory_is_typed(gpu: ac.ComputeClient) -> None:
    total = gpu.properties.extra["total_memory"]
    first = gpu.empty(int(total * 0.6))
    second = gpu.empty(int(total * 0.6))  # more than is left
    with pytest.raises(ac.OutOfMemory):
        await gpu.sync()
    del first, second
    gpu.memory_cleanup()
    h = gpu.create(b"still fine")
    assert await gpu.read([h]) == [b"still fine"]


async def test_profile_times_device_work(gpu: ac.ComputeClient) -> None:
    outer = gpu.start_profile()
    inner = gpu.start_profile()
    gpu.execute(SPIN, ac.CubeCount(1), spin_bindings(0.02))
    d_inner = await gpu.end_profile(inner)
    d_outer = await gpu.end_profile(outer)
    assert d_inner.method is ac.TimingMethod.DEVICE
    assert 0.019 < d_inner.seconds < 0.5
    assert d_outer.start_ns <= d_inner.start_ns <= d_inner.end_ns <= d_outer.end_ns


async def test_awaiting_a_long_kernel_keeps_the_loop_free(gpu: ac.ComputeClient) -> None:
    gpu.execute(SPIN, ac.CubeCount(1), spin_bindings(0.0))
    await gpu.sync()  # compiled and loaded
    lags: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t0 - 0.001)

    tick = asyncio.create_task(ticker())
    cpu0, t0 = time.process_time(), time.perf_counter()
    gpu.execute(SPIN, ac.CubeCount(1), spin_bindings(0.3))
    await gpu.sync()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    stop.set()
    await tick
    assert 0.29 < wall < 1.0
    assert sorted(lags)[int(0.99 * len(lags))] < 0.002
    assert cpu / wall < 0.5  # not a spinning core (the ticker itself costs a little)


async def test_concurrent_tasks_get_their_own_streams(gpu: ac.ComputeClient) -> None:
    gpu.execute(SPIN, ac.CubeCount(1), spin_bindings(0.0))
    await gpu.sync()

    async def task() -> None:
        gpu.execute(SPIN, ac.CubeCount(1), spin_bindings(0.1))
        await gpu.sync()

    t0 = time.perf_counter()
    await asyncio.gather(*(task() for _ in range(4)))
    assert time.perf_counter() - t0 < 0.3  # 4 x 0.1 s kernels overlapped


@pytest.mark.allow_loop_lag  # pinning 8 MiB the first time takes milliseconds
async def test_large_writes_are_snapshotted_into_pinned_memory(gpu: ac.ComputeClient) -> None:
    size = 8 << 20
    data = np.arange(size, dtype=np.uint8)
    h = gpu.empty(size)
    gpu.write([(h.copy_descriptor((size,), (1,), 1), data)])
    await gpu.sync()  # its pinned staging buffer goes back to the pool
    gpu.server.end_batch()
    snap = gpu.server.snapshot(np.zeros(size, np.uint8))  # type: ignore[attr-defined]
    assert snap is not None and len(snap) == size and not any(snap[:16])
    del snap
    expected = data.copy()
    gpu.write([(h.copy_descriptor((size,), (1,), 1), data)])
    data[:] = 1  # later changes do not leak in
    (out,) = await gpu.read([h])
    assert np.array_equal(np.frombuffer(out, np.uint8), expected)
    assert gpu.server.snapshot(b"x" * size) is None  # type: ignore[attr-defined]


async def test_small_reads_reuse_their_pinned_buffers(gpu: ac.ComputeClient) -> None:
    handles = [gpu.create(bytes([i]) * 1024) for i in range(6)]
    for _ in range(3):
        for i, h in enumerate(handles):
            assert await gpu.read([h]) == [bytes([i]) * 1024]
    kept = gpu.server._small_reads  # type: ignore[attr-defined]
    assert 1 <= len(kept[1024]) <= 4


async def test_requests_of_many_tasks_take_the_one_call_routes(gpu: ac.ComputeClient) -> None:
    """The request as users write it in 64 tasks at once: every answer right, and most
    one-call route offers taken (a task's commands run ahead of other tasks' queued
    ones: ``channel/footprint.py``)."""
    fast = gpu._fast  # type: ignore[attr-defined]

    async def requests(i: int) -> None:
        for j in range(8):
            a = np.full(256, i * 8 + j, np.float32)
            x, y = gpu.create(a.tobytes()), gpu.empty(a.nbytes)
            gpu.execute(ADD, blocks(256), add_bindings(x, x, y, 256))
            (out,) = await gpu.read([y])
            assert np.array_equal(np.frombuffer(out, np.float32), 2 * a)

    await requests(0)  # a spare pinned buffer of the size, slices to reuse
    hits, declined = fast.stats
    await asyncio.gather(*(requests(i) for i in range(64)))
    taken, left = fast.stats[0] - hits, fast.stats[1] - declined
    assert taken >= 0.5 * (taken + left), (taken, left)


async def test_large_request_bodies_are_staged_by_the_copy_helpers(
    gpu: ac.ComputeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request as users write it with 1 MiB and 512 KiB bodies of ``bytes``, 64 tasks
    at once: each body is staged into page-locked memory by ``hot.copy_into`` with the
    copy helpers taking pieces (forced on, whatever the core count); every answer is
    right, and the helpers took part (compiled module)."""
    from asynccube._core.cuda import transfers
    from asynccube._core.cuda.native.hotpath import ACTIVE, hot

    monkeypatch.setattr(transfers, "COPY_HELPERS", 3)
    pooled = hot.copy_stats()[0]

    async def requests(i: int, n: int) -> None:
        for j in range(3):
            a = np.arange(n, dtype=np.float32) + np.float32(i * 3 + j)
            x, y = gpu.create(a.tobytes()), gpu.empty(a.nbytes)
            gpu.execute(ADD, blocks(n), add_bindings(x, x, y, n))
            (out,) = await gpu.read([y])
            assert np.array_equal(np.frombuffer(out, np.float32), 2 * a), (i, j, n)

    await requests(0, 1 << 18)  # pinned buffers of the size
    await asyncio.gather(*(requests(i, (1 << 18) >> (i % 2)) for i in range(64)))
    if ACTIVE == "native":
        assert hot.copy_stats()[0] >= pooled + 64 * 3, hot.copy_stats()


async def test_concurrent_small_reads_suspend_and_see_their_bytes(gpu: ac.ComputeClient) -> None:
    """Issue 38: the request as users write it with 1 KiB and 64 KiB bodies and a kernel
    that keeps its stream busy for 200 µs, 64 tasks at once: once reads spin long, a read
    issued while other tasks are ready defers (its task suspends, one sweep settles the
    reads the device is done with), and every answer is right."""
    fast = gpu._fast  # type: ignore[attr-defined]
    deferred, _ = fast.defer_stats

    async def requests(i: int, n: int) -> None:
        for j in range(4):
            a = np.arange(n, dtype=np.float32) + np.float32(i * 4 + j)
            x, y = gpu.create(a.tobytes()), gpu.empty(a.nbytes)
            gpu.execute(SPIN, ac.CubeCount(1), spin_bindings(200e-6))
            gpu.execute(ADD, blocks(n), add_bindings(x, x, y, n))
            (out,) = await gpu.read([y])
            assert np.array_equal(np.frombuffer(out, np.float32), 2 * a), (i, j, n)

    for n in (256, 16384):
        await requests(0, n)  # a spare pinned buffer of the size
        await asyncio.gather(*(requests(i, n) for i in range(64)))
    assert fast.defer_stats[0] >= deferred + 64, fast.defer_stats


async def test_a_buffer_a_queued_command_writes_is_read_after_it(gpu: ac.ComputeClient) -> None:
    """Stream 1's slow kernel and its write to a shared buffer wait in the queue (the
    loop iteration's budget spent); stream 2's read of that buffer waits behind them
    (it binds a buffer they bind) and sees the write; stream 3, which shares nothing,
    runs ahead."""
    n = 256
    shared = gpu.create(np.zeros(n, np.float32).tobytes())
    ones = gpu.create(np.ones(n, np.float32).tobytes())
    other = gpu.create(np.full(n, 5, np.float32).tobytes())
    await gpu.read([other])  # a spare pinned buffer of the size: the one-call read
    await gpu.sync()
    channel = gpu._channel  # type: ignore[attr-defined]
    channel._inline_spent = channel.budget  # Python-route commands queue from here
    with ac.StreamId.pinned(1):
        gpu.empty(12345)  # the route's allocation: queued
        gpu.execute(SPIN, ac.CubeCount(1), spin_bindings(0.05))  # behind it
        gpu.execute(ADD, blocks(n), add_bindings(ones, ones, shared, n))
    with ac.StreamId.pinned(3):
        ahead = gpu.read([other])
    with ac.StreamId.pinned(2):
        behind = gpu.read([shared])
    assert await ahead == [np.full(n, 5, np.float32).tobytes()]
    (out,) = await behind  # the add's result: the read was ordered after the write
    assert np.array_equal(np.frombuffer(out, np.float32), np.full(n, 2, np.float32))


async def test_create_stages_each_body_until_the_device_copied_it(
    gpu: ac.ComputeClient,
) -> None:
    """``create(bytes)`` through ``FastLaunch.write``: bodies created while their stream
    is busy (a 50 ms kernel queued ahead of their copies) each get a staging buffer of
    their own, and every buffer reads back its own body; once read (the stream passed
    the copies), the next creates reuse those staging buffers. SPIN is loaded first: a
    kernel's first launch waits in the queue for its load, on this stream, and creates
    behind it are left to the route (their copies must not pass it; the scenario
    ``write_connected`` of ``fast_write_scenario.py`` shows both on the no-op driver)."""
    size, n = 4096, 8
    fast = gpu._fast  # type: ignore[attr-defined]
    gpu.execute(SPIN, ac.CubeCount(1), spin_bindings(0.0))  # loads SPIN
    dropped = [gpu.empty(size) for _ in range(2 * n)]  # slices for fast.empty to take
    await gpu.sync()
    await actor_idle(gpu)  # after the load: the routes below are what is counted
    del dropped
    gpu.execute(SPIN, ac.CubeCount(1), spin_bindings(0.05))
    hits = fast.write_stats[0]
    made = [gpu.create(bytes([i]) * size) for i in range(n)]
    assert fast.write_stats[0] - hits == n, (fast.write_stats, fast.stats)
    spares = gpu.server._small_writes[size]  # type: ignore[attr-defined]
    assert len({id(buf) for buf, _ in spares}) == n
    for i, h in enumerate(made):
        assert await gpu.read([h]) == [bytes([i]) * size]
    kept = {id(buf) for buf, _ in spares}
    again = [gpu.create(bytes([100 + i]) * size) for i in range(n)]
    assert fast.write_stats[0] - hits == 2 * n, fast.write_stats
    assert {id(buf) for buf, _ in spares} == kept, "the staging buffers were reused"
    for i, h in enumerate(again):
        assert await gpu.read([h]) == [bytes([100 + i]) * size]
