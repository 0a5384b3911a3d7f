"""all_reduce: bus bandwidth of ``ac.all_reduce`` across clients, beside
``torch.distributed.all_reduce`` with NCCL (one process per GPU) in the same run.

    python benchmarks/bench_allreduce.py --devices cuda:0,cuda:1 [--mib 256] [--rounds 9]
    python benchmarks/bench_allreduce.py --devices host,host --mib 16

busbw = 2 (n-1)/n * bytes / time (NCCL's convention), median of ``--rounds`` timed
rounds after two warm-up rounds; each asynccube round is ``await ac.all_reduce(...)``
(queued and completed: the sync is in the time). On host clients the peer is numpy
itself: the same element-wise sums of the same arrays in one thread (the staged path's
floor, without its reads and writes). NVLink multicast stays off
(``NCCL_NVLS_ENABLE=0`` in this process and the ones it starts). Writes
``results/allreduce.md|json`` (``allreduce_host`` for host clients) for ``report.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import time
from typing import Any

import numpy as np
from _common import environment, table, write

import asynccube as ac
from asynccube._core.cuda import nccl

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # before any communicator, here or spawned
WARMUP = 2


def busbw_gbs(n: int, nbytes: int, seconds: float) -> float:
    """NCCL's bus bandwidth of an all-reduce, in GB/s."""
    return 2 * (n - 1) / n * nbytes / seconds / 1e9 if n > 1 else 0.0


async def asynccube_seconds(devices: list[str], nbytes: int, rounds: int) -> list[float]:
    """Seconds of each timed ``await ac.all_reduce`` over float32 buffers of ``nbytes``."""
    clients = [await ac.connect(d) for d in devices]
    try:
        count = nbytes // 4
        pairs = [(c, c.create(np.full(count, 1.0 / len(devices), np.float32))) for c in clients]
        for c in clients:
            await c.sync()
        times = []
        for i in range(WARMUP + rounds):
            start = time.perf_counter()
            await ac.all_reduce(pairs, "float32")
            if i >= WARMUP:
                times.append(time.perf_counter() - start)
        got = await clients[0].read_array(pairs[0][1], np.float32)
        assert np.isfinite(got[:16]).all()
        return times
    finally:
        for c in clients:
            await c.close()


def numpy_seconds(n: int, nbytes: int, rounds: int) -> list[float]:
    """The host peer: the same sums in numpy, one thread, into a preallocated buffer."""
    arrays = [np.full(nbytes // 4, 1.0 / n, np.float32) for _ in range(n)]
    out = np.empty_like(arrays[0])
    times = []
    for i in range(WARMUP + rounds):
        start = time.perf_counter()
        np.copyto(out, arrays[0])
        for a in arrays[1:]:
            np.add(out, a, out=out)
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    return times


def _torch_rank(rank: int, n: int, port: int, nbytes: int, rounds: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    os.environ["NCCL_NVLS_ENABLE"] = os.environ.get("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", world_size=n, rank=rank)
    x = torch.full((nbytes // 4,), 1.0 / n, dtype=torch.float32, device=f"cuda:{rank}")
    times = []
    for i in range(WARMUP + rounds):
        dist.barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    if rank == 0:
        out.put((times, torch.__version__, torch.cuda.nccl.version()))
    dist.destroy_process_group()


def torch_seconds(n: int, nbytes: int, rounds: int) -> tuple[list[float], str]:
    """``torch.distributed.all_reduce`` with NCCL, one spawned process per GPU."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.spawn(_torch_rank, args=(n, port, nbytes, rounds, out), nprocs=n, join=True)
    times, version, nccl_version = out.get()
    return times, f"torch {version}, NCCL {'.'.join(map(str, nccl_version))}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", default="host,host")
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    devices = args.devices.split(",")
    n, nbytes, rounds = len(devices), args.mib << 20, max(5, args.rounds)
    ours = asynccube_seconds(devices, nbytes, rounds)
    mine = statistics.median(asyncio.run(ours))
    on_gpus = all(d.startswith("cuda") for d in devices)
    path = "NCCL" if on_gpus and nccl.find_library() else "staged (numpy)"
    rows: list[list[Any]] = [
        [f"ac.all_reduce ({path})", f"{mine * 1e3:.2f}", f"{busbw_gbs(n, nbytes, mine):.2f}", ""]
    ]
    figures: dict[str, Any] = {"devices": devices, "bytes": nbytes, "asynccube_s": mine}
    if on_gpus:
        times, peer_name = torch_seconds(n, nbytes, rounds)
        peer = statistics.median(times)
        peer_row = f"torch.distributed.all_reduce ({peer_name})"
    else:
        peer = statistics.median(numpy_seconds(n, nbytes, rounds))
        peer_row = "numpy sums alone (the staged path's floor)"
    rows.append([peer_row, f"{peer * 1e3:.2f}", f"{busbw_gbs(n, nbytes, peer):.2f}", ""])
    rows[0][3] = f"{peer / mine:.2f}"
    figures.update(peer_s=peer, peer=peer_row, ratio=peer / mine)
    header = ["all-reduce", "time (ms)", "busbw (GB/s)", "vs peer"]
    command = f"`python benchmarks/bench_allreduce.py --devices {args.devices} --mib {args.mib}`"
    body = table(header, rows) + (
        f"\n\n{args.mib} MiB float32 sum across {n} clients ({args.devices}), median of "
        f"{rounds} rounds after {WARMUP} warm-up; busbw = 2(n-1)/n x bytes / time. {command}"
    )
    if n == 1:
        body += (
            "\n\nOne client: NCCL runs a one-rank communicator, so the bus moves nothing "
            "(busbw 0); the times are each call's own cost, not a bandwidth."
        )
    name = "allreduce_host" if "host" in args.devices else "allreduce"
    write(name, f"all_reduce across {args.devices}", environment(args.devices), body, figures)


if __name__ == "__main__":
    main()
