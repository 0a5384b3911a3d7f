"""Collectives on several GPUs: ``ac.all_reduce`` (and ``broadcast``, ``all_gather``,
``reduce_scatter`` where asynccube has them) beside ``torch.distributed`` with NCCL
(one process per GPU) on a curve of sizes, and the event loop's lag while they run.

    python benchmarks/bench_collectives.py --devices cuda:0,cuda:1
    python benchmarks/bench_collectives.py --devices cuda:0,cuda:1 --sizes 64K,1M,256M --quick
    python benchmarks/bench_collectives.py --devices host,host --sizes 64K,1M   # smoke test

Two ways of calling, each the same for both libraries:

- **awaited**: every call waits for its result (``await ac.all_reduce(...)``; torch:
  the call, then ``torch.cuda.synchronize()``), the median of ``--rounds`` calls after
  warm-up: what a step that needs the result at once pays;
- **queued**: ``--batch`` calls back to back, then one wait for all of them (asynccube:
  the awaitables awaited in turn), divided by the batch: what a training loop that keeps
  the device busy pays.

Sizes are each GPU's buffer (float32): the all-reduce's and broadcast's buffer, the
all-gather's input (its output is n times that), the reduce-scatter's input (output 1/n).
``vs torch`` = torch's time / asynccube's (above 1: asynccube is faster). Loop lag: a
:class:`asynccube.LoopMonitor` ticking every millisecond while ``all_reduce`` of
``--lag-size`` runs awaited, then queued, for ``--lag-seconds`` each: p99 and max of the
tick's lateness, and the worst step. NVLink multicast stays off (``NCCL_NVLS_ENABLE=0``
here and in every process started). Writes ``results/collectives.md|json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from _common import environment, table, write

import asynccube as ac

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # before any communicator, here or spawned
WARMUP = 3
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")


def parse_size(text: str) -> int:
    """``64K``, ``1M``, ``1G`` or a byte count."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text[-1:] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def label(nbytes: int) -> str:
    """A size as ``64 KiB``, ``256 MiB``, ``1 GiB``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def available() -> list[str]:
    """The collectives this asynccube has."""
    return [name for name in COLLECTIVES if hasattr(ac, name)]


# --- asynccube ----------------------------------------------------------------------


class Buffers:
    """Each client's buffers for every collective at one size (float32)."""

    def __init__(self, clients: list[ac.ComputeClient], nbytes: int) -> None:
        n = len(clients)
        count = nbytes // 4
        self.n = n
        # zeros: sums of many calls stay finite (the tests check the values themselves)
        self.reduce = [(c, c.create(np.zeros(count, np.float32))) for c in clients]
        self.gather = [
            (c, c.create(np.full(count, float(i), np.float32)), c.empty(nbytes * n))
            for i, c in enumerate(clients)
        ]
        self.scatter = [
            (c, c.create(np.full(count * n, 1.0, np.float32)), c.empty(nbytes)) for c in clients
        ]

    def call(self, name: str) -> Callable[[], Awaitable[None]]:
        """One call of collective ``name`` on these buffers."""
        if name == "all_reduce":
            return lambda: ac.all_reduce(self.reduce, "float32")
        if name == "broadcast":
            return lambda: ac.broadcast(self.reduce, root=0)  # type: ignore[attr-defined]
        if name == "all_gather":
            return lambda: ac.all_gather(self.gather)  # type: ignore[attr-defined]
        return lambda: ac.reduce_scatter(self.scatter, "float32")  # type: ignore[attr-defined]


async def asynccube_times(
    devices: list[str], sizes: list[int], names: list[str], rounds: int, batch: int
) -> dict[tuple[str, int], tuple[float, float]]:
    """(awaited median, queued per call) seconds for each (collective, size)."""
    clients = [await ac.connect(d) for d in devices]
    out: dict[tuple[str, int], tuple[float, float]] = {}
    try:
        for nbytes in sizes:
            bufs = Buffers(clients, nbytes)
            for c in clients:
                await c.sync()
            for name in names:
                call = bufs.call(name)
                times = []
                for i in range(WARMUP + rounds):
                    start = time.perf_counter()
                    await call()
                    if i >= WARMUP:
                        times.append(time.perf_counter() - start)
                queued = []
                for _ in range(3):
                    start = time.perf_counter()
                    pending = [call() for _ in range(batch)]
                    for aw in pending:
                        await aw
                    queued.append((time.perf_counter() - start) / batch)
                out[(name, nbytes)] = (statistics.median(times), min(queued))
            await check(clients, bufs, names)
            del bufs
    finally:
        for c in clients:
            await c.close()
    return out


async def check(clients: list[ac.ComputeClient], bufs: Buffers, names: list[str]) -> None:
    """The results are right (each collective ran last on its own buffers)."""
    n = bufs.n
    got = await clients[-1].read_array(bufs.reduce[-1][1], np.float32)
    assert (got[:16] == 0).all(), got[:16]
    if "all_gather" in names:
        out = await clients[-1].read_array(bufs.gather[-1][2], np.float32)
        chunk = out.size // n
        for i in range(n):
            assert (out[i * chunk : i * chunk + 16] == i).all(), (i, out[i * chunk : i * chunk + 4])
    if "reduce_scatter" in names:
        out = await clients[0].read_array(bufs.scatter[0][2], np.float32)
        assert (out[:16] == n).all(), out[:16]  # n inputs of 1.0, summed


async def lag(devices: list[str], nbytes: int, seconds: float, batch: int) -> dict[str, Any]:
    """Loop lag while all_reduce runs awaited, then queued in batches."""
    clients = [await ac.connect(d) for d in devices]
    try:
        bufs = Buffers(clients, nbytes)
        for c in clients:
            await c.sync()
        report: dict[str, Any] = {}
        for mode in ("awaited", "queued"):
            monitor = ac.LoopMonitor(interval=0.001, record_above=0.0005, threshold=0.005)
            monitor.start()
            calls = 0
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                if mode == "awaited":
                    await ac.all_reduce(bufs.reduce, "float32")
                    calls += 1
                else:
                    pending = [ac.all_reduce(bufs.reduce, "float32") for _ in range(batch)]
                    for aw in pending:
                        await aw
                    calls += batch
            snap = monitor.snapshot()
            monitor.stop()
            worst = snap.worst_step
            report[mode] = {
                "calls": calls,
                "p50_ms": snap.p50 * 1e3,
                "p99_ms": snap.p99 * 1e3,
                "max_ms": snap.max * 1e3,
                "worst": None
                if worst is None
                else f"{worst.seconds * 1e3:.2f} ms: {worst.culprit}",
            }
        return report
    finally:
        for c in clients:
            await c.close()


# --- torch.distributed ----------------------------------------------------------------


def _torch_calls(dist: Any, torch: Any, count: int, n: int, rank: int, dev: str) -> dict[str, Any]:
    """Each collective's call on this rank's tensors of ``count`` float32 elements."""
    x = torch.zeros(count, dtype=torch.float32, device=dev)
    g_in = torch.full((count,), float(rank), dtype=torch.float32, device=dev)
    g_out = torch.empty(count * n, dtype=torch.float32, device=dev)
    s_in = torch.ones(count * n, dtype=torch.float32, device=dev)
    s_out = torch.empty(count, dtype=torch.float32, device=dev)
    return {
        "all_reduce": lambda: dist.all_reduce(x),
        "broadcast": lambda: dist.broadcast(x, src=0),
        "all_gather": lambda: dist.all_gather_into_tensor(g_out, g_in),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(s_out, s_in),
    }


def _torch_rank(*args: Any) -> None:
    rank, n, port, sizes, names, rounds, batch, q = args
    import torch
    import torch.distributed as dist

    os.environ["NCCL_NVLS_ENABLE"] = os.environ.get("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", world_size=n, rank=rank)
    dev = f"cuda:{rank}"
    out: dict[tuple[str, int], tuple[float, float]] = {}
    for nbytes in sizes:
        calls = _torch_calls(dist, torch, nbytes // 4, n, rank, dev)
        for name in names:
            call = calls[name]
            times = []
            for i in range(WARMUP + rounds):
                dist.barrier()
                torch.cuda.synchronize()
                start = time.perf_counter()
                call()
                torch.cuda.synchronize()
                if i >= WARMUP:
                    times.append(time.perf_counter() - start)
            queued = []
            for _ in range(3):
                dist.barrier()
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(batch):
                    call()
                torch.cuda.synchronize()
                queued.append((time.perf_counter() - start) / batch)
            out[(name, nbytes)] = (statistics.median(times), min(queued))
        del calls
        torch.cuda.empty_cache()
    if rank == 0:
        q.put((out, torch.__version__, ".".join(map(str, torch.cuda.nccl.version()))))
    dist.destroy_process_group()


def torch_times(
    n: int, sizes: list[int], names: list[str], rounds: int, batch: int
) -> tuple[dict[tuple[str, int], tuple[float, float]], str]:
    """The same calls through ``torch.distributed`` with NCCL, one process per GPU."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.spawn(_torch_rank, args=(n, port, sizes, names, rounds, batch, q), nprocs=n, join=True)
    out, version, nccl_version = q.get()
    return out, f"torch {version}, NCCL {nccl_version}"


# --- report ---------------------------------------------------------------------------


def busbw(name: str, n: int, nbytes: int, seconds: float) -> float:
    """nccl-tests' bus bandwidth (GB/s) of one call on buffers of ``nbytes`` per GPU."""
    if name == "all_reduce":
        return 2 * (n - 1) / n * nbytes / seconds / 1e9
    if name == "broadcast":
        return nbytes / seconds / 1e9
    if name == "all_gather":
        return (n - 1) * nbytes / seconds / 1e9  # (n-1)/n of the n*nbytes output
    return (n - 1) * nbytes / seconds / 1e9  # reduce_scatter: (n-1)/n of the n*nbytes input


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", default="cuda:0,cuda:1")
    parser.add_argument("--sizes", default="64K,1M,16M,64M,256M,1G")
    parser.add_argument("--collectives", default=",".join(COLLECTIVES))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--lag-size", default="64M")
    parser.add_argument("--lag-seconds", type=float, default=3.0)
    parser.add_argument("--quick", action="store_true", help="fewer rounds, shorter lag runs")
    args = parser.parse_args()
    devices = args.devices.split(",")
    n = len(devices)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    names = [m for m in args.collectives.split(",") if m in available()]
    rounds, batch, seconds = args.rounds, args.batch, args.lag_seconds
    if args.quick:
        rounds, batch, seconds = 7, 10, 1.5
    ours = asyncio.run(asynccube_times(devices, sizes, names, rounds, batch))
    lags = asyncio.run(lag(devices, parse_size(args.lag_size), seconds, batch))
    on_gpus = all(d.startswith("cuda") for d in devices) and n > 1
    peer: dict[tuple[str, int], tuple[float, float]] = {}
    peer_name = "-"
    if on_gpus:
        peer, peer_name = torch_times(n, sizes, names, rounds, batch)
    rows = []
    for name in names:
        for nbytes in sizes:
            mine_a, mine_q = ours[(name, nbytes)]
            row = [name, label(nbytes)]
            row += [f"{mine_a * 1e6:.1f}", f"{busbw(name, n, nbytes, mine_a):.1f}"]
            if (name, nbytes) in peer:
                t_a, t_q = peer[(name, nbytes)]
                row += [f"{t_a * 1e6:.1f}", f"{t_a / mine_a:.2f}"]
                row += [f"{mine_q * 1e6:.1f}", f"{t_q * 1e6:.1f}", f"{t_q / mine_q:.2f}"]
            else:
                row += ["-", "-", f"{mine_q * 1e6:.1f}", "-", "-"]
            rows.append(row)
    header = [
        "collective",
        "size / GPU",
        "ac awaited (µs)",
        "ac busbw (GB/s)",
        "torch awaited (µs)",
        "vs torch",
        "ac queued (µs/call)",
        "torch queued (µs/call)",
        "vs torch (queued)",
    ]
    lag_rows = [
        [
            mode,
            f"{label(parse_size(args.lag_size))}",
            r["calls"],
            f"{r['p50_ms']:.3f}",
            f"{r['p99_ms']:.3f}",
            f"{r['max_ms']:.3f}",
            r["worst"] or "-",
        ]
        for mode, r in lags.items()
    ]
    lag_header = ["all_reduce", "size", "calls", "lag p50 (ms)", "lag p99 (ms)", "max", "worst"]
    command = "`python benchmarks/bench_collectives.py"
    command += f" --devices {args.devices} --sizes {args.sizes}"
    command += " --quick`" if args.quick else "`"
    body = (
        table(header, rows)
        + f"\n\nPeer: {peer_name}, one process per GPU. float32, {n} clients; awaited: median of "
        f"{rounds} calls after {WARMUP} warm-up; queued: {batch} calls then one wait, best of 3. "
        f"{command}\n\nThe loop while all_reduce runs (LoopMonitor ticking every 1 ms, "
        f"{seconds} s each):\n\n" + table(lag_header, lag_rows)
    )
    figures = {
        "devices": devices,
        "peer": peer_name,
        "asynccube": {f"{k[0]}@{k[1]}": v for k, v in ours.items()},
        "torch": {f"{k[0]}@{k[1]}": v for k, v in peer.items()},
        "lag": lags,
    }
    name = "collectives" if on_gpus else "collectives_host"
    write(name, f"Collectives across {args.devices}", environment(args.devices), body, figures)


if __name__ == "__main__":
    main()
