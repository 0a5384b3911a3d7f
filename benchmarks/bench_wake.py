"""Loop iterations and µs per awaited call where the device is done at once, on the
no-op driver of ``bench_overhead.py`` (no GPU needed): ``execute`` + ``await sync()``,
``await wait(stream)`` on a raw stream handle, ``await read([h])`` of 1 KiB.

The iterations an await took are counted by a callback that queues itself again each
loop iteration (its count before and after the await); the µs are the best of 5 rounds
of ``--reps`` calls, measured without that callback. A sync the device is done with
suspends exactly once (issue 38: it used to take two loop iterations); a wait or read
done within its spin does not suspend. Run::

    PYTHONPATH=src python benchmarks/bench_wake.py [--loop asyncio|uvloop] [--reps N]
    ASYNCCUBE_NO_EXTENSIONS=1 PYTHONPATH=src python benchmarks/bench_wake.py
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

import bench_overhead

from asynccube._core.testing.ticks import loop_ticks


async def _iterations(fn: Callable[[], Awaitable[None]], calls: int = 200) -> float:
    """Loop iterations per ``await fn()``."""
    count, stop = loop_ticks()
    await asyncio.sleep(0)
    before = count[0]
    for _ in range(calls):
        await fn()
    per_call = (count[0] - before) / calls
    stop()
    await asyncio.sleep(0)
    return per_call


async def _us(fn: Callable[[], Awaitable[None]], reps: int) -> float:
    """µs per ``await fn()``: the best of 5 rounds of ``reps``."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            await fn()
        best = min(best, (time.perf_counter() - t0) / reps * 1e6)
    return best


async def measure(reps: int) -> dict[str, tuple[float, float]]:
    """(loop iterations, µs) per round of each scenario."""
    import asynccube as ac
    from asynccube._core.client.client import ComputeClient

    client = ComputeClient(bench_overhead._server(), asyncio.get_running_loop())
    empty = ac.Kernel("wk_empty", cuda=ac.CudaSource(bench_overhead.ADD, "empty_kernel", (1, 1, 1)))
    one, none, unchecked = ac.CubeCount(1), ac.Bindings(), ac.ExecutionMode.UNCHECKED
    client.execute(empty, one, none)
    h = client.create(bytes(1024))
    await client.sync()
    await client.read([h])
    await client.wait(0x5000)

    async def sync() -> None:
        client.execute(empty, one, none, unchecked)
        await client.sync()

    async def wait() -> None:
        await client.wait(0x5000)  # a raw stream handle (the fake says: this context's)

    async def read() -> None:
        await client.read([h])

    out = {}
    for name, fn in (("execute + await sync", sync), ("await wait(stream)", wait),
                     ("await read 1 KiB", read)):  # fmt: skip
        out[name] = (await _iterations(fn), await _us(fn, reps))
    await client.close()
    return out


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--reps", type=int, default=10000)
    args = parser.parse_args()
    bench_overhead.install_fake()
    from asynccube._core.cuda.native.hotpath import ACTIVE

    if args.loop == "uvloop":
        import uvloop

        figures = uvloop.run(measure(args.reps))
    else:
        figures = asyncio.run(measure(args.reps))
    print(f"hot path: {ACTIVE}, loop: {args.loop}")
    for name, (its, us) in figures.items():
        print(f"{name:22s} {its:5.2f} loop iterations {us:7.2f} us")


if __name__ == "__main__":
    main()
