"""What the safety of the client's awaitables costs per call (issue 28).

``read``, ``sync`` and the other awaited calls return a client future that warns when it
is dropped unawaited and gives an error nobody retrieved back to its stream (see
``asynccube._core.channel.awaitable``). This measures, in one run and one process, a
1 KiB ``read`` round trip and an ``execute`` + ``await sync()`` pair with those futures
beside the same client whose futures are plain ``asyncio`` futures (the module's
factory swapped before the client opens), in alternating rounds::

    python benchmarks/bench_client_futures.py [--device cuda:0|host] [--rounds 5]

The ratio is the median of the rounds' paired ratios. Writes ``results/client_futures``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from _common import environment, table, write

import asynccube as ac
from asynccube._core.channel import settle

REPS = 2000
EMPTY = ac.Kernel(
    "bench_client_futures_empty",
    cuda=ac.CudaSource('extern "C" __global__ void e() {}', entry="e"),
    host=lambda launch: None,
)


def _plain(cls: Any, loop: asyncio.AbstractEventLoop, held: Any) -> asyncio.Future[Any]:
    return loop.create_future()


async def _figures(device: str) -> dict[str, float]:
    async with ac.open_client(device) as client:
        h = client.create(bytes(1024))
        one, none, mode = ac.CubeCount(1), ac.Bindings(), ac.ExecutionMode.UNCHECKED
        client.execute(EMPTY, one, none, mode)
        await client.sync()
        reads, syncs = [], []
        for i in range(REPS + 200):
            t0 = time.perf_counter()
            await client.read([h])
            t1 = time.perf_counter()
            client.execute(EMPTY, one, none, mode)
            await client.sync()
            t2 = time.perf_counter()
            if i >= 200:
                reads.append(t1 - t0)
                syncs.append(t2 - t1)
        return {"read": statistics.median(reads) * 1e6, "sync": statistics.median(syncs) * 1e6}


def _round(device: str, plain: bool) -> dict[str, float]:
    original = settle.new_future
    if plain:
        settle.new_future = _plain  # type: ignore[assignment]
    try:
        return asyncio.run(_figures(device))
    finally:
        settle.new_future = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="default: cuda:0 if usable, else host")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    device = args.device or asyncio.run(_default_device())
    rounds = []
    for k in range(args.rounds):
        order = (False, True) if k % 2 == 0 else (True, False)
        got = {plain: _round(device, plain) for plain in order}
        rounds.append(got)
    rows, figures = [], {}
    for name, label in (("read", "await 1 KiB read (µs)"), ("sync", "execute + await sync (µs)")):
        ours = statistics.median(r[False][name] for r in rounds)
        plain = statistics.median(r[True][name] for r in rounds)
        ratio = statistics.median(r[False][name] / r[True][name] for r in rounds)
        rows.append([label, f"{ours:.2f}", f"{plain:.2f}", f"{ours - plain:+.2f}", f"{ratio:.2f}x"])
        figures[name] = {"client_futures_us": ours, "plain_futures_us": plain, "ratio": ratio}
    body = table(
        ["figure", "client futures", "plain asyncio futures", "cost", "ratio (median of pairs)"],
        rows,
    )
    body += (
        f"\n\nMedian of {REPS} round trips per round, {args.rounds} alternating rounds, one "
        "process. Command: `python benchmarks/bench_client_futures.py`."
    )
    write("client_futures", "Cost of the client's awaitables (issue 28)", environment(device),
          body, figures)  # fmt: skip


async def _default_device() -> str:
    async with ac.open_client() as client:
        return client.device


if __name__ == "__main__":
    main()
