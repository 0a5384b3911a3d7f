"""Where ``await client.wait(torch_stream)``, ``await read`` of 1 KiB and ``await sync``
after a launch spend their time on a GPU, piece by piece (issue 38's tight-loop goals):
medians of 2000 calls a piece over four rounds (the first dropped), then cProfile of the
wait and of the read.

    python benchmarks/profile_wait_sync.py

Needs torch with CUDA and a GPU; without them it says so and exits 0. The output of a
run is kept in ``profiles/requests/sync-wait-h200.md``.
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import pstats
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from _common import amedian_us, median_us

import asynccube as ac
from asynccube._core.client import foreign

CALLS = 2000
TWICE = ac.Kernel(
    "profile_wait_sync_twice",
    cuda=ac.CudaSource(
        r"""extern "C" __global__ void twice(float* x, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 2.0f * x[i];
}""",
        entry="twice",
    ),
)


def _median_us(fn: Callable[[], object]) -> float:
    return median_us(fn, CALLS)


async def _amedian_us(fn: Callable[[], Awaitable[object]]) -> float:
    return await amedian_us(fn, CALLS)


def _print_rows(kind: str, rows: dict[str, list[float]]) -> None:
    for name, values in rows.items():
        print(f"{kind:5s} {name:58s} " + " ".join(f"{v:7.2f}" for v in values[1:]))


async def _profiled(fn: Callable[[], Awaitable[object]], lines: int) -> None:
    """cProfile of 3000 ``await fn()``, its ``lines`` costliest functions printed."""
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(3000):
        await fn()
    pr.disable()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(lines)
    print(out.getvalue())


async def _wait_pieces(client: ac.ComputeClient, torch: Any) -> None:
    from cuda.bindings import driver

    stream, x = torch.cuda.Stream(), torch.zeros(1, device="cuda")
    _, event = driver.cuEventCreate(int(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING))
    handle = stream.cuda_stream
    server: Any = client._server  # type: ignore[attr-defined]
    channel: Any = client._channel  # type: ignore[attr-defined]

    def kernel() -> None:
        with torch.cuda.stream(stream):
            x.add_(1)

    def raw() -> None:
        kernel()
        driver.cuEventRecord(event, handle)
        driver.cuEventSynchronize(event)

    def raw_idle() -> None:
        driver.cuEventRecord(event, handle)
        driver.cuEventSynchronize(event)

    def capture_and_poll() -> None:
        work = foreign.describe(stream, "wait")
        channel.activate()
        server.capture_foreign(work)
        server.foreign_done(work, 30e-6)

    async def ours() -> None:
        kernel()
        await client.wait(stream)

    async def ours_idle() -> None:
        await client.wait(stream)

    pieces: dict[str, Callable[[], object]] = {
        "tiny torch kernel + cuEventRecord + cuEventSynchronize": raw,
        "the tiny torch kernel alone": kernel,
        "cuEventRecord + cuEventSynchronize, nothing queued": raw_idle,
        "describe(torch stream)": lambda: foreign.describe(stream, "wait"),
        "describe + capture + foreign_done": capture_and_poll,
    }
    rows: dict[str, list[float]] = {}
    await ours()
    for _ in range(4):
        for name, fn in pieces.items():
            rows.setdefault(name, []).append(_median_us(fn))
        rows.setdefault("tiny torch kernel + await client.wait", []).append(await _amedian_us(ours))
        rows.setdefault("await client.wait, nothing queued", []).append(
            await _amedian_us(ours_idle)
        )
    _print_rows("wait", rows)
    await _profiled(ours, 25)
    driver.cuEventDestroy(event)


async def _read_and_sync(client: ac.ComputeClient) -> None:
    from cuda.bindings import driver

    h = client.create(np.zeros(256, np.float32))
    await client.read([h])
    server: Any = client._server  # type: ignore[attr-defined]
    pointer = server._ptr(h.binding())
    _, host = driver.cuMemHostAlloc(1024, 0)
    _, stream = driver.cuStreamCreate(1)

    def raw_read() -> None:
        driver.cuMemcpyDtoHAsync(host, pointer, 1024, stream)
        driver.cuStreamSynchronize(stream)

    async def read() -> None:
        await client.read([h])

    rows: dict[str, list[float]] = {}
    for _ in range(4):
        rows.setdefault("cuMemcpyDtoHAsync + cuStreamSynchronize", []).append(_median_us(raw_read))
        rows.setdefault("await read([h]), 1 KiB", []).append(await _amedian_us(read))
    _print_rows("read", rows)
    await _profiled(read, 15)
    bindings = ac.Bindings().with_buffer(h.binding()).with_scalar(np.uint32, [256])
    client.execute(TWICE, ac.CubeCount(1), bindings)
    await client.sync()
    execs, calls, awaits = [], [], []
    for _ in range(4 * CALLS):
        t0 = time.perf_counter()
        client.execute(TWICE, ac.CubeCount(1), bindings)
        t1 = time.perf_counter()
        fut = client.sync()
        t2 = time.perf_counter()
        await fut
        t3 = time.perf_counter()
        execs.append(t1 - t0)
        calls.append(t2 - t1)
        awaits.append(t3 - t2)
    print(
        f"sync  execute {statistics.median(execs) * 1e6:.2f} µs, the sync() call "
        f"{statistics.median(calls) * 1e6:.2f}, the await {statistics.median(awaits) * 1e6:.2f}"
    )
    driver.cuStreamDestroy(stream)
    driver.cuMemFreeHost(host)


async def main() -> None:
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        print("profile_wait_sync: skipped (needs torch with CUDA and a GPU)")
        return
    async with ac.open_client("cuda:0") as client:
        await _wait_pieces(client, torch)
        await _read_and_sync(client)


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
