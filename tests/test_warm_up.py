"""Warm-up runs (issue 40, cubecl-runtime's ``dry_run``): ``client.warm_up()`` compiles
and drops the calling task's launches, reads back nothing stale, counts what it
compiled, found cached, stored and what failed, leaves other tasks' launches alone and
ends cleanly on an exception or a cancel; ``client.tuning()`` tunes every tuner key of
its task now. Each device of the shared client suite (cuda:0 marked), asyncio and trio;
the compile statistics also on a host server that compiles the CUDA parts with NVRTC
(which runs without a GPU), so compiled / cached / stored / failed are real here."""

from __future__ import annotations

import itertools
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import asynccube as ac
from asynccube._core.channel.backend import current_backend
from asynccube._core.client.client import ComputeClient
from asynccube._core.cuda.compiler import KernelCompiler
from asynccube._core.server.preparation import KernelPrepared

from .tune_helpers import three_speeds, tuner

pytestmark = pytest.mark.anyio  # each backend: asyncio and trio

RUNS: list[str] = []
"""Host kernels that ran (a dropped launch never does)."""

TWICE_CUDA = r"""
extern "C" __global__ void warm_twice(float* x, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 2.0f * x[i];
}
"""
_ids = itertools.count()


def _twice_host(launch: ac.HostLaunch) -> None:
    x = launch.buffers[0].view(np.float32)
    x[: int(launch.scalar(np.uint32))] *= 2
    RUNS.append("twice")


def twice(name: str = "warm_twice") -> ac.Kernel:
    """x *= 2, in place (a kernel id of its own per test where the statistics matter)."""
    return ac.Kernel(name, cuda=ac.CudaSource(TWICE_CUDA, "warm_twice"), host=_twice_host)


def fresh_twice() -> ac.Kernel:
    """``twice`` with an id and a source never seen before, in this process or any
    other's disk cache (so a warm-up compiles it: no cache hit)."""
    n = next(_ids)
    source = TWICE_CUDA.replace("warm_twice", f"warm_twice_{n}") + f"// {uuid.uuid4()}\n"
    return ac.Kernel(
        f"warm_twice_{n}_{uuid.uuid4().hex[:8]}",
        cuda=ac.CudaSource(source, f"warm_twice_{n}"),
        host=_twice_host,
    )


def launch_twice(client: ac.ComputeClient, kernel: ac.Kernel, h: ac.Handle, n: int) -> None:
    bindings = ac.Bindings().with_buffer(h.binding()).with_scalar(np.uint32, [n])
    client.execute(kernel, ac.CubeCount(1), bindings)


async def launch_async(client: ac.ComputeClient, kernel: ac.Kernel, h: ac.Handle, n: int) -> None:
    launch_twice(client, kernel, h, n)


async def read_f32(client: ac.ComputeClient, h: ac.Handle) -> Any:
    return await client.read_array(h, np.float32)


async def handler(client: ac.ComputeClient, kernel: ac.Kernel, body: bytes) -> bytes:
    """A request as a service writes it: create, launch, read."""
    x = client.create(body)
    launch_twice(client, kernel, x, len(body) // 4)
    (out,) = await client.read([x])
    return bytes(out)


# -- a warm-up launches nothing, and reads back nothing stale ------------------------


async def test_a_warm_up_launches_nothing(client: ac.ComputeClient) -> None:
    kernel, data = twice(), np.arange(8, dtype=np.float32)
    before = client.create(data)  # made before the scope: left as it was
    RUNS.clear()
    async with client.warm_up() as stats:
        during = client.create(data)  # made in the scope: its bytes are real until bound
        np.testing.assert_array_equal(await read_f32(client, during), data)
        launch_twice(client, kernel, before, 8)
        launch_twice(client, kernel, during, 8)
        np.testing.assert_array_equal(await read_f32(client, before), data)  # unchanged
    assert RUNS == []  # the host part never ran
    assert stats.launches == 2 and stats.kernels == 1 and not stats.failures
    np.testing.assert_array_equal(await read_f32(client, before), data)
    with pytest.raises(ac.LaunchDropped, match="dropped by a warm-up scope") as caught:
        await read_f32(client, during)  # never its old bytes, as if they were a result
    assert isinstance(caught.value, ac.TaintedBuffer)
    launch_twice(client, kernel, before, 8)  # outside the scope: it runs
    np.testing.assert_array_equal(await read_f32(client, before), 2 * data)
    await client.sync()  # nothing was held on the stream


async def test_a_read_of_a_dropped_result_ends_the_pass(client: ac.ComputeClient) -> None:
    reached = []
    async with client.warm_up() as stats:
        body = np.ones(4, np.float32).tobytes()
        await handler(client, twice(), body)  # its read raises LaunchDropped: absorbed
        reached.append(True)
    assert reached == [] and stats.launches == 1
    # a group of them (a task group's) is absorbed too
    async with client.warm_up(), anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(handler, client, twice(), body)
    assert await handler(client, twice(), body) == (2 * np.ones(4, np.float32)).tobytes()


async def test_other_errors_leave_the_scope_and_it_cleans_up(client: ac.ComputeClient) -> None:
    kernel, data = twice(), np.ones(4, np.float32)
    h = client.create(data)
    with pytest.raises(ValueError, match="boom"):
        async with client.warm_up():
            raise ValueError("boom")
    with anyio.CancelScope() as cancel:
        async with client.warm_up():
            cancel.cancel()
            await anyio.sleep(5)
    assert cancel.cancelled_caught
    assert client._channel.guard is None  # the one-call routes are back
    launch_twice(client, kernel, h, 4)  # the scope is over: it runs
    np.testing.assert_array_equal(await read_f32(client, h), 2 * data)


async def test_kernels_written_once_are_dropped_too(client: ac.ComputeClient) -> None:
    axpb = ac.elementwise("y = a * x + b", name="warm_axpb")
    x = client.create_array(np.arange(4, dtype=np.float32))
    async with client.warm_up() as stats:
        y = axpb(client, x=x, a=2.0, b=1.0)
    assert stats.launches == 1 and stats.kernels == 1 and not stats.failures
    with pytest.raises(ac.LaunchDropped):
        await client.read_array(y)
    np.testing.assert_array_equal(await client.read_array(x), np.arange(4))
    y = axpb(client, x=x, a=2.0, b=1.0)
    np.testing.assert_array_equal(await client.read_array(y), [1, 3, 5, 7])


# -- statistics and failures -----------------------------------------------------------

SEEN: list[ac.WarmUpStats] = []
"""The statistics of the last scopes :func:`warm_up_launches` opened."""


async def warm_up_launches(
    client: ac.ComputeClient, scope: Any, kernels: list[ac.Kernel]
) -> ac.WarmUpStats:
    """Launch each kernel once in ``scope`` (a warm-up) over a new buffer."""
    async with scope as stats:
        SEEN.append(stats)
        for kernel in kernels:
            launch_twice(client, kernel, client.create(bytes(16)), 4)
    return stats  # type: ignore[no-any-return]


async def test_a_second_warm_up_finds_everything_loaded(client: ac.ComputeClient) -> None:
    kernels = [fresh_twice(), fresh_twice()]
    body = np.ones(4, np.float32).tobytes()
    counts = []
    for _ in range(2):
        async with client.warm_up() as stats:
            for kernel in (*kernels, kernels[0]):
                x = client.create(body)
                launch_twice(client, kernel, x, 4)
        counts.append(stats)
    first, second = counts
    assert first.launches == 3 and first.kernels == 2 and not first.failures
    assert first.compiled + first.from_cache + first.already_loaded == 2
    if client.device == "host":  # numpy compiles nothing
        assert first.already_loaded == 2
    else:
        assert first.compiled == 2 and first.stored <= 2  # fresh sources: NVRTC ran
    assert (second.kernels, second.already_loaded, second.compiled) == (2, 2, 0)


async def test_a_kernel_that_fails_is_reported_and_poisons_nothing(
    client: ac.ComputeClient,
) -> None:
    missing = "cuda" if client.device == "host" else "host"  # no part for this device
    parts: dict[str, Any] = {"cuda": ac.CudaSource(TWICE_CUDA, "warm_twice")}
    if missing == "host":
        parts = {"host": _twice_host}
    broken = ac.Kernel("warm_broken", **parts)
    good, h = twice(), client.create(np.ones(4, np.float32))
    with pytest.raises(ac.WarmUpError, match="warm_broken") as caught:
        await warm_up_launches(client, client.warm_up(), [broken, good])
    assert isinstance(caught.value.failures["warm_broken"], ac.KernelNotSupported)
    stats = SEEN[-1]
    assert set(stats.failures) == {"warm_broken"} and stats.failed == 1
    stats = await warm_up_launches(client, client.warm_up(raise_on_failure=False), [broken])
    assert set(stats.failures) == {"warm_broken"}
    launch_twice(client, good, h, 4)  # nothing is held: later launches run
    np.testing.assert_array_equal(await read_f32(client, h), 2 * np.ones(4))
    await client.sync()
    with pytest.raises(ac.InvalidArgument, match="raise_on_failure"):
        client.warm_up(raise_on_failure=1)  # type: ignore[arg-type]


async def test_a_launch_the_channel_queued_is_counted_before_the_scope_ends() -> None:
    """A dropped launch is counted when the actor reaches it; one the channel queued (a
    GPU server's create often queues; here the loop iteration's budget is spent) is
    reached before the scope counts and raises (on a GPU its failure went unreported)."""
    loop = current_backend("test").loop
    client = ComputeClient(ac.HostServer(), loop, batch_seconds=1e-6)
    broken = ac.Kernel("warm_queued", cuda=ac.CudaSource(TWICE_CUDA, "warm_twice"))
    try:
        with pytest.raises(ac.WarmUpError, match="warm_queued"):
            await queued_launches(client, client.warm_up(), broken)
        stats = await queued_launches(client, client.warm_up(raise_on_failure=False), broken)
        assert set(stats.failures) == {"warm_queued"} and stats.launches == 2
    finally:
        await client.close()


async def queued_launches(client: ac.ComputeClient, scope: Any, kernel: ac.Kernel) -> Any:
    """Launch ``kernel`` twice in ``scope``, the launches queued for the actor."""
    async with scope as stats:
        for _ in range(2):
            launch_twice(client, kernel, client.create(bytes(16)), 4)
        assert client._channel._queue  # queued: the budget is spent
    return stats


# -- the scope belongs to its task --------------------------------------------------------


async def test_another_tasks_launches_run_during_a_warm_up(client: ac.ComputeClient) -> None:
    kernel, data = twice(), np.arange(4, dtype=np.float32)
    opened, served = anyio.Event(), anyio.Event()
    results: dict[str, Any] = {}

    async def serve() -> None:
        await opened.wait()
        h = client.create(data)
        launch_twice(client, kernel, h, 4)
        results["served"] = await read_f32(client, h)
        served.set()

    async def warm() -> None:
        async with client.warm_up() as stats:
            opened.set()
            h = client.create(data)
            launch_twice(client, kernel, h, 4)
            async with anyio.create_task_group() as inner:  # started inside: warmed
                inner.start_soon(launch_async, client, kernel, client.create(data), 4)
            await served.wait()  # the other task served meanwhile
        results["stats"] = stats

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        tg.start_soon(warm)
    np.testing.assert_array_equal(results["served"], 2 * data)
    assert results["stats"].launches == 2


async def test_a_task_that_outlives_its_scope_is_not_in_it(client: ac.ComputeClient) -> None:
    kernel, data = twice(), np.arange(4, dtype=np.float32)
    go, done = anyio.Event(), anyio.Event()
    results: dict[str, Any] = {}

    async def later() -> None:
        await go.wait()
        h = client.create(data)
        launch_twice(client, kernel, h, 4)
        results["later"] = await read_f32(client, h)
        done.set()

    async with anyio.create_task_group() as tg:
        scope = client.warm_up()
        async with scope as stats:
            tg.start_soon(later)  # started inside the scope
        async with client.warm_up():  # another task's scope is open meanwhile
            go.set()  # it launches after its scope ended: for real
            await done.wait()
    np.testing.assert_array_equal(results["later"], 2 * data)
    assert stats.launches == 0
    with pytest.raises(ac.InvalidArgument, match="entered once"):
        async with scope:
            pass


# -- tuners ---------------------------------------------------------------------------


async def test_a_warm_up_compiles_every_candidate_and_measures_nothing(tmp_path: Path) -> None:
    calls = Counter[str]()
    tune, tunables = tuner(tmp_path), three_speeds(calls)
    async with ac.open_client("host") as client, client.warm_up() as stats:
        assert await tune.execute(client, tunables, 1000) == "slow"  # the default
    assert calls == {"slow": 1, "medium": 1, "fast": 1} and tune.runs == 0
    assert stats.launches == 3 and not stats.tune_failures


async def test_a_tuning_scope_tunes_now_even_in_background_mode(tmp_path: Path) -> None:
    async with ac.open_client("host") as client:
        await tuning_scopes(client, tmp_path)


async def tuning_scopes(client: ac.ComputeClient, tmp_path: Path) -> None:
    calls = Counter[str]()
    tune = tuner(tmp_path, mode=ac.TuneMode.BACKGROUND)
    tunables = three_speeds(calls)
    async with client.warm_up(), client.tuning() as stats:  # measuring, in a warm-up
        assert await tune.execute(client, tunables, 1000) == "fast"
    assert (stats.tuned, stats.tune_cached, stats.tune_stored) == (1, 0, 1)
    assert tune.runs == 1
    async with client.tuning() as again:
        assert await tune.execute(client, tunables, 1000) == "fast"
    assert (again.tuned, again.tune_cached) == (0, 1) and tune.runs == 1
    async with client.warm_up() as warm:  # tuned: only the pick runs (dropped)
        calls.clear()
        assert await tune.execute(client, tunables, 1000) == "fast"
    assert calls == {"fast": 1} and warm.launches == 1


# -- compile statistics with NVRTC, without a GPU ------------------------------------


class NvrtcHostServer(ac.HostServer):
    """A host server that, for a warm-up, compiles each kernel's CUDA part with NVRTC
    (for sm_80, through a compile cache in ``cache_dir``) and "loads" it: what the CUDA
    server's hook does, without the driver."""

    def __init__(self, cache_dir: Path) -> None:
        super().__init__(max_streams=2)
        self.compiler = KernelCompiler(cache_dir=cache_dir)
        self.loaded: set[str] = set()

    def warm_up_launch(self, kernel: ac.Kernel, *args: Any) -> Any:
        super().warm_up_launch(kernel, *args)
        if kernel.id in self.loaded:
            return None

        def job() -> KernelPrepared:
            _, origin, stored = self.compiler.compile_traced(kernel.cuda_part("cuda"), "sm_80")
            self.loaded.add(kernel.id)
            return KernelPrepared(origin, stored)

        return job


def nvrtc_client(cache_dir: Path) -> ComputeClient:
    pytest.importorskip("cuda.bindings.nvrtc")
    return ComputeClient(NvrtcHostServer(cache_dir), current_backend("test").loop)


BAD = ac.Kernel("warm_bad", cuda=ac.CudaSource("this is not C++", "bad"), host=_twice_host)


async def test_compiled_cached_stored_and_failed_are_counted(tmp_path: Path) -> None:
    client = nvrtc_client(tmp_path)
    try:
        await nvrtc_statistics(client, tmp_path)
    finally:
        await client.close()


async def nvrtc_statistics(client: ac.ComputeClient, tmp_path: Path) -> None:
    kernel, body = fresh_twice(), np.ones(4, np.float32).tobytes()
    async with client.warm_up() as first:
        await handler(client, kernel, body)
    assert (first.compiled, first.from_cache, first.stored) == (1, 0, 1)
    async with client.warm_up() as second:
        await handler(client, kernel, body)
    assert (second.compiled, second.already_loaded) == (0, 1)
    with pytest.raises(ac.WarmUpError, match="warm_bad") as caught:
        await warm_up_launches(client, client.warm_up(), [BAD, kernel])
    failed = SEEN[-1]
    assert isinstance(caught.value.failures["warm_bad"], ac.CompilationError)
    assert isinstance(caught.value.__cause__, ac.CompilationError)
    assert failed.failed == 1 and failed.already_loaded == 1
    h = client.create(np.ones(4, np.float32))
    launch_twice(client, BAD, h, 4)  # a real launch: its host part runs, nothing held
    np.testing.assert_array_equal(await read_f32(client, h), 2 * np.ones(4))
    await client.sync()
    async with nvrtc_client(tmp_path) as other, other.warm_up() as cached:
        await handler(other, kernel, body)  # a new server: the cubin is on disk
    assert (cached.compiled, cached.from_cache, cached.stored) == (0, 1, 0)
