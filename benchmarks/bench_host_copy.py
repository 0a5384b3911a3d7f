"""Large copies on the host server, and the event loop meanwhile (issue 28, point 2).

    python benchmarks/bench_host_copy.py [--sizes 64,256,1024] [--rounds 3] [--path both]

For each size (MiB), in one run and one process per hot path (compiled, and the
pure-Python twin with ``ASYNCCUBE_NO_EXTENSIONS=1``), it times

* ``create``: ``client.create(array)`` then ``await client.sync()`` (the handle is
  dropped between rounds, so later rounds reuse the pool's page, as an application does);
* ``write``: ``client.write`` of the whole buffer, then ``await client.sync()``;
* ``read``: ``await client.read([handle])`` (a new ``bytes``, dropped on the loop);
* ``read_array``: ``await client.read_array(handle, np.uint8)`` (a new array);

while a ticker task measures the loop's lag: it sleeps 1 ms at a time and records how late
it woke (p50 / p99 / max over every tick of every round of that operation). The peer, in
the same process: a plain ``np.copyto`` of the same size into memory already touched
(``warm``: what ``create`` and ``write`` do once the pool holds the page) and into a new
``np.empty`` (``fresh``: what a read must do, its result being new memory). Throughput is
the median round's; the ratio is against the matching peer (goal: >= 80%, lag p99 <= 2 ms).
Writes ``results/host_copy.md|json`` for ``report.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, table, write

import asynccube as ac

MIB = 1 << 20
TICK = 0.001
OPS = ("create", "write", "read", "read_array")


def _copyto(n: int, src: np.ndarray[Any, Any], rounds: int) -> dict[str, float]:
    """Seconds (median) of a plain np.copyto of ``n`` bytes, warm and fresh."""
    dst = np.empty(n, np.uint8)
    np.copyto(dst, src)
    warm, fresh = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        np.copyto(dst, src)
        warm.append(time.perf_counter() - t)
    del dst
    for _ in range(rounds):
        t = time.perf_counter()
        new = np.empty(n, np.uint8)
        np.copyto(new, src)
        fresh.append(time.perf_counter() - t)
        del new
    return {"warm": statistics.median(warm), "fresh": statistics.median(fresh)}


def _queued_seconds(fd: int | None) -> float:
    """The calling thread's time runnable but waiting for a CPU (``schedstat``)."""
    return 0.0 if fd is None else int(os.pread(fd, 96, 0).split()[1]) / 1e9


class Ticker:
    """Measures how late a 1 ms sleep wakes, while ``running``: as is, and net of the
    time the loop thread waited for a CPU (other processes' load, not a blocked loop)."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.net: list[float] = []
        self.running = False
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        try:
            fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            fd = None
        while True:
            q, t = _queued_seconds(fd), time.perf_counter()
            await asyncio.sleep(TICK)
            if self.running:
                late = time.perf_counter() - t - TICK
                self.lags.append(late)
                self.net.append(late - (_queued_seconds(fd) - q))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def _one_size(client: ac.ComputeClient, n: int, rounds: int) -> dict[str, Any]:
    src = await asyncio.to_thread(np.full, n, 7, np.uint8)
    ticker = Ticker()
    ticker.start()
    times: dict[str, list[float]] = {op: [] for op in OPS}
    lags: dict[str, list[float]] = {op: [] for op in OPS}
    net: dict[str, list[float]] = {op: [] for op in OPS}
    kept = {"handle": client.create(src)}
    await client.sync()

    async def timed(op: str) -> None:
        ticker.lags, ticker.net = [], []
        ticker.running = True
        t = time.perf_counter()
        handle = kept["handle"]
        if op == "create":
            h = client.create(src)
            await client.sync()
            del h
        elif op == "write":
            client.write([(handle.copy_descriptor((n,), (1,), 1), src)])
            await client.sync()
        elif op == "read":
            (raw,) = await client.read([handle])
            assert len(raw) == n
            del raw
        else:
            arr = await client.read_array(handle, np.uint8)
            assert arr.size == n
            del arr
        times[op].append(time.perf_counter() - t)
        await asyncio.sleep(3 * TICK)  # the ticks the last of it delayed
        ticker.running = False
        lags[op] += ticker.lags
        net[op] += ticker.net

    for _ in range(rounds):
        for op in OPS:
            await timed(op)
    await ticker.stop()
    kept.clear()
    await client.sync()
    base = await asyncio.to_thread(_copyto, n, src, rounds)
    out: dict[str, Any] = {"copyto_warm_s": base["warm"], "copyto_fresh_s": base["fresh"]}
    for op in OPS:
        xs, ns = sorted(lags[op]), sorted(net[op])
        peer = base["warm"] if op in ("create", "write") else base["fresh"]
        seconds = statistics.median(times[op])
        out[op] = {
            "seconds": seconds,
            "gb_s": n / seconds / 1e9,
            "vs_copyto": peer / seconds,
            "lag_p50_ms": xs[len(xs) // 2] * 1e3,
            "lag_p99_ms": xs[min(len(xs) - 1, int(0.99 * len(xs)))] * 1e3,
            "lag_max_ms": xs[-1] * 1e3,
            "net_lag_p99_ms": ns[min(len(ns) - 1, int(0.99 * len(ns)))] * 1e3,
            "net_lag_max_ms": ns[-1] * 1e3,
            "ticks": len(xs),
        }
    return out


async def _child(sizes: list[int], rounds: int) -> dict[str, Any]:
    async with ac.open_client("host") as client:
        return {str(s): await _one_size(client, s * MIB, rounds) for s in sizes}


def _run_path(path: str, sizes: list[int], rounds: int) -> dict[str, Any]:
    env = dict(os.environ, ASYNCCUBE_NO_EXTENSIONS="1" if path == "python" else "0")
    args = [sys.executable, __file__, "--child", ",".join(map(str, sizes)), str(rounds)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"the {path} run failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def _rows(path: str, figures: dict[str, Any]) -> list[list[str]]:
    rows = []
    for size, fig in figures.items():
        peers = f"warm {fig['copyto_warm_s'] * 1e3:.1f} ms, fresh "
        peers += f"{fig['copyto_fresh_s'] * 1e3:.1f} ms"
        for op in OPS:
            f = fig[op]
            peer = "warm" if op in ("create", "write") else "fresh"
            rows.append(
                [
                    f"{op} {size} MiB ({path})",
                    f"{f['lag_p50_ms']:.2f} / {f['lag_p99_ms']:.2f} / {f['lag_max_ms']:.2f}",
                    f"{f['net_lag_p99_ms']:.2f} / {f['net_lag_max_ms']:.2f}",
                    f"{f['gb_s']:.2f} ({f['seconds'] * 1e3:.1f} ms)",
                    f"{f['vs_copyto']:.0%} of {peer}",
                    peers,
                ]
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64,256,1024", help="MiB, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--path", choices=("both", "native", "python"), default="both")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sizes = [int(s) for s in args.child[0].split(",")]
        print(json.dumps(asyncio.run(_child(sizes, int(args.child[1])))))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    paths = ("native", "python") if args.path == "both" else (args.path,)
    load_before = os.getloadavg()[0]
    figures = {p: _run_path(p, sizes, args.rounds) for p in paths}
    load = f"load average (1 min) {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    rows = [row for p in paths for row in _rows(p, figures[p])]
    header = [
        "operation",
        "loop lag p50 / p99 / max (ms)",
        "net of CPU wait p99 / max (ms)",
        "GB/s (median)",
        "vs np.copyto",
        "np.copyto, same run",
    ]
    body = (
        table(header, rows)
        + "\n\nGoal: lag p99 <= 2 ms, throughput >= 80% of np.copyto of the same size. "
        f"Median of {args.rounds} rounds, {load} (on {os.cpu_count()} cores). "
        "Lag: how late a 1 ms sleep of a ticker task woke, over every tick of every round "
        "(the net column subtracts the time the loop "
        "thread was runnable but had no CPU: other processes' load). Results are dropped "
        "on the loop (a 1 GiB free costs a few ms, in the max). Command: "
        "`python benchmarks/bench_host_copy.py`."
    )
    title = "Large host copies and the event loop (issue 28)"
    extra = {"rounds": args.rounds, "load": load}
    write("host_copy", title, environment(), body, {**extra, **figures})


if __name__ == "__main__":
    main()
