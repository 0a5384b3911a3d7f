"""Client round trips under each event-loop backend: asyncio, uvloop (if installed) and
trio (issue 13), on the host server or a GPU, in one run.

    python benchmarks/bench_backends.py [--device host|cuda:0] [--n 1000] [--rounds 5]

Each round runs every backend in turn (so drifting machine load hits all of them alike):
a fresh loop opens a client and times, per iteration (median of ``--n`` iterations; the
best round is kept; µs):

* ``execute + await read 1 KiB``: a launch on a 1 KiB buffer, then an awaited read of it;
* ``execute + await sync``: a launch, then an awaited ``sync``;
* ``execute (fire-and-forget)``: the caller's cost of one launch (mean over a batch,
  the actor's draining included through a final ``sync``).

The ratio trio / asyncio is the figure (goal <= 1.5x). Writes ``results/backends.md|json``
(``backends_cuda`` on a GPU) for ``report.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import clock, environment, table, write

import asynccube as ac

TOUCH_CUDA = r"""
extern "C" __global__ void touch(unsigned char* x) { if (threadIdx.x == 0) x[0] += 1; }
"""


def _touch_host(launch: ac.HostLaunch) -> None:
    launch.buffers[0][:1] += 1  # (an array op: wraps around without a warning)


TOUCH = ac.Kernel(
    "bench_backends_touch", cuda=ac.CudaSource(TOUCH_CUDA, "touch", (1, 1, 1)), host=_touch_host
)
ONE = ac.CubeCount(1)
BACKENDS = ("asyncio", "uvloop", "trio")
FIGURES = ("execute + await read 1 KiB", "execute + await sync", "execute (fire-and-forget)")


async def _median_us(step: Callable[[], Awaitable[Any]], n: int) -> float:
    times = []
    for _ in range(n):
        start = clock()
        await step()
        times.append(clock() - start)
    return statistics.median(times) * 1e6


async def _figures(device: str, n: int) -> dict[str, float]:
    async with ac.open_client(device) as client:
        h = client.create(np.zeros(1024, np.uint8))
        bindings = ac.Bindings().with_buffer(h.binding())

        async def read() -> Any:
            client.execute(TOUCH, ONE, bindings)
            return await client.read([h])

        async def sync() -> None:
            client.execute(TOUCH, ONE, bindings)
            await client.sync()

        async def fire() -> float:
            await client.sync()
            start = clock()
            for _ in range(n):
                client.execute(TOUCH, ONE, bindings)
            await client.sync()
            return (clock() - start) / n * 1e6

        for _ in range(200):  # warm up: compile, pools, worker threads
            await read()
        return {
            FIGURES[0]: await _median_us(read, n),
            FIGURES[1]: await _median_us(sync, n),
            FIGURES[2]: await fire(),
        }


def _run(backend: str, device: str, n: int) -> dict[str, float] | str:
    coro = _figures(device, n)
    if backend == "asyncio":
        return asyncio.run(coro)
    if backend == "uvloop":
        try:
            import uvloop
        except ImportError:
            coro.close()
            return "uvloop is not installed"
        return uvloop.run(coro)
    try:
        import trio
    except ImportError:
        coro.close()
        return "trio is not installed"
    return trio.run(lambda: coro)


def _best_rounds(device: str, n: int, rounds: int) -> dict[str, dict[str, float] | str]:
    """Each figure's best over ``rounds`` rounds, each round running every backend."""
    runs: dict[str, list[dict[str, float] | str]] = {b: [] for b in BACKENDS}
    for _ in range(rounds):
        for backend in BACKENDS:
            runs[backend].append(_run(backend, device, n))
    best: dict[str, dict[str, float] | str] = {}
    for backend, got in runs.items():
        figures = [r for r in got if isinstance(r, dict)]
        best[backend] = (
            {fig: min(r[fig] for r in figures) for fig in FIGURES} if figures else str(got[0])
        )
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="host")
    parser.add_argument("--n", type=int, default=1000, help="iterations per figure")
    parser.add_argument("--rounds", type=int, default=7, help="rounds; the best is kept")
    args = parser.parse_args()
    results = _best_rounds(args.device, args.n, args.rounds)
    base, trio = results["asyncio"], results["trio"]
    rows, ratios = [], {}
    for fig in FIGURES:
        cells = [fig]
        for backend in BACKENDS:
            r = results[backend]
            cells.append(f"{r[fig]:.1f}" if isinstance(r, dict) else "-")
        if isinstance(base, dict) and isinstance(trio, dict):
            ratios[fig] = trio[fig] / base[fig]
            cells += [f"{ratios[fig]:.2f}x", "yes" if ratios[fig] <= 1.5 else "NO"]
        rows.append(cells)
    header = ["round trip (median µs)", "asyncio", "uvloop", "trio", "trio / asyncio", "<= 1.5x"]
    skipped = [f"{b}: {r}" for b, r in results.items() if isinstance(r, str)]
    cuda = args.device.startswith("cuda")
    body = (
        table(header, rows)
        + ("\n\nSkipped: " + "; ".join(skipped) if skipped else "")
        + f"\n\n{args.n} iterations per figure, best median of {args.rounds} rounds, the "
        "backends alternating within each round. Command: "
        f"`python benchmarks/bench_backends.py --device {args.device}`.\n"
    )
    name = "backends_cuda" if cuda else "backends"
    title = f"Event-loop backends: trio vs asyncio ({'GPU' if cuda else 'host server'}, issue 13)"
    write(
        name,
        title,
        environment(args.device),
        body,
        {"device": args.device, "n": args.n, "backends": results, "trio_over_asyncio": ratios},
    )


if __name__ == "__main__":
    main()
