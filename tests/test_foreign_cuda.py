"""``client.wait(obj)`` / ``client.after(obj)`` on the GPU: torch's and CuPy's streams
and events, raw handles and ``cuda.bindings``' streams; the loop stays free while they
run; ``after`` orders asynccube's kernels after another library's work without a sync;
cancellation frees what the wait used; another device's and a destroyed stream raise
ForeignStreamError."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

import asynccube as ac

from .kernels import SCALE, blocks
from .test_cuda_server import SPIN, spin_bindings

pytestmark = pytest.mark.cuda
aio = pytest.mark.asyncio
lag_ok = pytest.mark.allow_loop_lag  # torch's and CuPy's first use of a kernel loads it
# on the loop thread; the waits themselves are probed (LoopLagProbe) where that is the point

BUSY_SECONDS = 0.3


@pytest.fixture(scope="module")
def torch_busy() -> Callable[[Any, float], None]:
    """Queues about ``seconds`` of float32 matmuls on a torch stream of cuda:0 (calibrated
    here, outside the event loop: cuBLAS's first use takes a while). Every tensor and
    stream names cuda:0: on a machine of several GPUs the current device may be another
    one, and work on another device's stream would leave the tested stream idle."""
    torch = pytest.importorskip("torch")
    a = torch.randn(4096, 4096, device="cuda:0")  # ~100 launches a second: queued in ~1 ms
    b = torch.randn(4096, 4096, device="cuda:0")
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(0)
    each = float("inf")
    for _ in range(3):  # the fastest of three: an idle GPU's clocks ramp up meanwhile, and
        start = time.perf_counter()  # a slow first measure would queue too little work
        for _ in range(20):
            a @ b
        torch.cuda.synchronize(0)
        each = min(each, (time.perf_counter() - start) / 20)

    def busy(stream: Any, seconds: float) -> None:
        with torch.cuda.stream(stream):
            for _ in range(max(1, int(seconds / each))):
                a @ b

    return busy


@pytest_asyncio.fixture
async def gpu() -> Any:
    async with ac.open_client("cuda:0") as client:
        yield client


async def _ticks_while(awaitable: Any) -> tuple[Any, float, float]:
    """Await ``awaitable`` while a ticker sleeps 1 ms at a time, under the project's
    loop-lag probe: (result, seconds it took, longest gap between two ticks); fails if
    a callback held the loop past the probe's limit."""
    import asyncio

    from .lagprobe import MAX_LAG_SECONDS, LoopLagProbe

    gaps: list[float] = []
    stop = False

    async def tick() -> None:
        last = time.perf_counter()
        while not stop:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    probe = LoopLagProbe()
    probe.start()
    ticker = asyncio.ensure_future(tick())
    start = time.perf_counter()
    try:
        result = await awaitable
    finally:
        took = time.perf_counter() - start
        stop = True
        await ticker
        worst = await probe.stop()
    assert worst < MAX_LAG_SECONDS, f"the loop was held {worst * 1e3:.1f} ms: {probe.culprit}"
    return result, took, max(gaps, default=0.0)


@aio
@lag_ok
async def test_wait_on_a_torch_stream_frees_the_loop(
    gpu: ac.ComputeClient, torch_busy: Any
) -> None:
    import torch

    stream = torch.cuda.Stream(device=0)
    torch_busy(stream, BUSY_SECONDS)
    assert not stream.query()
    _, took, gap = await _ticks_while(gpu.wait(stream))
    assert stream.query()  # done: the wait did not end early
    assert took > BUSY_SECONDS / 3
    assert gap < 0.05  # the loop kept running
    await gpu.wait(torch.cuda.current_stream())  # the NULL stream (handle 0)
    await gpu.wait(stream.cuda_stream)  # a raw handle


@aio
@lag_ok
async def test_wait_on_a_torch_event_keeps_what_it_recorded(
    gpu: ac.ComputeClient, torch_busy: Any
) -> None:
    import torch

    busy, idle = torch.cuda.Stream(device=0), torch.cuda.Stream(device=0)
    torch_busy(busy, BUSY_SECONDS)
    event = torch.cuda.Event()
    await gpu.wait(event)  # never recorded: nothing to wait for
    event.record(busy)
    fut = gpu.wait(event)
    event.record(idle)  # re-recorded: the wait still stands for the busy stream's work
    await fut
    assert busy.query()


@aio
@lag_ok
async def test_after_a_torch_stream_orders_an_asynccube_kernel(
    gpu: ac.ComputeClient, torch_busy: Any
) -> None:
    import torch

    n = 1 << 20
    t = gpu.create_array(np.zeros(n, np.float32))
    await gpu.sync()
    stream = torch.cuda.Stream(device=0)
    source = torch.arange(n, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        shared = torch.from_dlpack(t)  # asynccube's memory, written by torch
    torch_busy(stream, BUSY_SECONDS)  # the copy lands only after this
    with torch.cuda.stream(stream):
        shared.copy_(source)
    gpu.after(stream)  # no sync: asynccube's stream waits for torch's on the device
    bindings = ac.Bindings().with_buffers([t.binding()])
    gpu.execute(
        SCALE, blocks(n), bindings.with_scalar(np.float32, [2.0]).with_scalar(np.uint32, [n])
    )
    out = await gpu.read_array(t)
    np.testing.assert_array_equal(out, np.arange(n, dtype=np.float32) * 2)
    del shared


@aio
@lag_ok
async def test_wait_and_after_on_cupy(gpu: ac.ComputeClient) -> None:
    cupy = pytest.importorskip("cupy")
    stream = cupy.cuda.Stream(non_blocking=True)
    a = cupy.random.rand(2048, 2048, dtype=cupy.float32)
    with stream:
        for _ in range(50):
            a = a @ a / 2048
    event = stream.record()
    await gpu.wait(event)
    assert event.done
    with stream:
        for _ in range(50):
            a = a @ a / 2048
    await gpu.wait(stream)
    assert stream.done
    gpu.after(stream)
    gpu.after(stream.record())
    await gpu.sync()


def _spin_then_record(gpu: ac.ComputeClient, seconds: float) -> Any:
    """A raw stream (cuda.bindings) that waits for an asynccube kernel of ``seconds``."""
    from cuda.bindings import driver

    gpu.execute(SPIN, ac.CubeCount(1), spin_bindings(seconds))
    gpu._channel.run_queued_inline()
    own = gpu._server.stream_handle(ac.StreamId.current())
    err, event = driver.cuEventCreate(0)
    assert not err
    assert not driver.cuEventRecord(event, own)[0]
    err, raw = driver.cuStreamCreate(1)  # non-blocking
    assert not err
    assert not driver.cuStreamWaitEvent(raw, event, 0)[0]
    driver.cuEventDestroy(event)
    return raw


@aio
@lag_ok
async def test_wait_on_a_raw_handle_and_a_cuda_bindings_stream(gpu: ac.ComputeClient) -> None:
    from cuda.bindings import driver

    gpu.execute(SPIN, ac.CubeCount(1), spin_bindings(0.0))  # compiled and loaded now
    await gpu.sync()
    for as_obj in (int, lambda s: s):
        raw = _spin_then_record(gpu, 0.2)
        _, took, gap = await _ticks_while(gpu.wait(as_obj(raw)))
        assert took > 0.1 and gap < 0.05
        assert driver.cuStreamQuery(raw)[0] == driver.CUresult.CUDA_SUCCESS
        driver.cuStreamDestroy(raw)


@aio
@lag_ok
async def test_a_cancelled_wait_frees_its_event_and_descriptor(
    gpu: ac.ComputeClient, torch_busy: Any
) -> None:
    import asyncio

    import torch

    stream = torch.cuda.Stream(device=0)

    async def cancel_three() -> None:
        for _ in range(3):
            torch_busy(stream, 0.1)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(gpu.wait(stream), 0.01)
        await gpu.wait(stream)  # the cancelled ones complete in the background

    await cancel_three()  # warm: the notifier, its C thread, torch's kernels
    await asyncio.sleep(0.05)
    fds = len(os.listdir("/proc/self/fd"))
    created = gpu._server._events.created
    await cancel_three()
    for _ in range(100):
        if not gpu._channel._pending and len(os.listdir("/proc/self/fd")) <= fds:
            break
        await asyncio.sleep(0.01)
    assert not gpu._channel._pending
    assert len(os.listdir("/proc/self/fd")) <= fds
    assert gpu._server._events.created < created + 3  # reused, not leaked (3 per round)
    assert (await gpu.read([gpu.create(b"ok")])) == [b"ok"]


@aio
@lag_ok
async def test_another_devices_stream_is_refused(gpu: ac.ComputeClient) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    other = torch.cuda.Stream(device=1)
    for call in (gpu.wait, gpu.after):
        with pytest.raises(ac.ForeignStreamError, match="cuda:1"):
            call(other)
    with pytest.raises(ac.ForeignStreamError, match="another device or context"):
        gpu.wait(other.cuda_stream)  # a raw handle: the driver says whose it is
    await gpu.sync()


def test_under_trio(torch_busy: Any) -> None:
    trio = pytest.importorskip("trio")
    import torch

    async def main() -> None:
        async with ac.open_client("cuda:0") as gpu:
            stream = torch.cuda.Stream(device=0)
            torch_busy(stream, 0.1)
            await gpu.wait(stream)
            assert stream.query()
            with trio.move_on_after(0.001):
                torch_busy(stream, 0.1)
                await gpu.wait(stream)
            await gpu.wait(stream)
            await gpu.sync()
            assert not gpu._channel._pending

    trio.run(main)


@aio
@lag_ok
async def test_a_wait_on_short_work_is_settled_in_one_call(gpu: ac.ComputeClient) -> None:
    """Issue 38: a tiny torch kernel, then ``client.wait(stream)``: the work is done
    within the spin, so ``FastSync.foreign`` settles the wait in the call (the capture
    back in the pool); a long one goes to the route, which waits for it."""
    torch = pytest.importorskip("torch")
    stream = torch.cuda.Stream(device=0)
    x = torch.zeros(1, device="cuda:0")
    fast, pool = gpu._fast_sync, gpu._server._events
    await gpu.wait(stream)  # warm: torch's kernel loaded
    hits = fast.foreign_hits
    for _ in range(20):
        with torch.cuda.stream(stream):
            x.add_(1)
        fut = gpu.wait(stream)
        await fut
    assert fast.foreign_hits >= hits + 15, (fast.foreign_hits, hits)  # a slow one may miss
    free = len(pool._free)
    await gpu.wait(stream)
    assert len(pool._free) == free
    assert x.item() == 20
