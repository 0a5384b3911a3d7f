"""Fragmentation under churn: growing and shrinking tensors (issue 40, expandable memory).

Run with ``python benchmarks/bench_memory_churn.py`` (``--device cuda:0``, the default
where a GPU is usable) or ``--device host`` (the pool logic only, no GPU). Writes
``results/memory_churn.md|json`` (``memory_churn_host`` for the host run).

The workload: ``--tensors`` live tensors; at each step one of them (in turn) is
replaced by a tensor ``x1.05`` to ``x1.3`` larger (or smaller), allocated before the old
one is dropped, each size walking up to ``--high`` and back down to ``--low`` and up
again: what a batch of growing sequences, a resized cache or a changing batch size does.
The figure is the peak bytes reserved over the peak bytes in use (requested, both
tensors of a step alive); 1.0 is no fragmentation at all. Beside it, the time a step's
allocation takes (with a sync on a GPU: an expandable range maps 2 MiB chunks one by
one when it grows, which the other pools do not).

What is measured, on the same sequence:

- the pool logic (always): asynccube's default layout (sliced pools up to 32 MiB,
  exclusive pages above) and its expandable pool, through ``MemoryManagement`` over a
  storage that maps nothing (2 MiB chunks, as CUDA's granularity);
- on ``cuda:N``: asynccube clients with ``[memory] pool = "default"`` and
  ``"expandable"`` (``memory_usage().bytes_reserved`` after each step), and PyTorch's
  caching allocator with and without ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
  (``torch.cuda.memory_reserved()``), each torch variant in a process of its own (the
  variable is read when CUDA starts there).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("asynccube") is None:  # run from a checkout: its src/
    sys.path.insert(0, str(ROOT / "src"))  # (never when imported with asynccube installed:
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests' subprocesses inherit it)

from _common import environment, table, write  # noqa: E402

from asynccube._core.memory import MemoryConfig, MemoryManagement  # noqa: E402
from asynccube._core.memory.storage import DryStorage  # noqa: E402

KiB = 1 << 10
MiB = 1 << 20
GOAL = 1.1
"""The expandable pool's bound on peak reserved / peak in use (issue 40)."""
SLICED_AT_LEAST = 1.5
"""What the sliced pools reach on the same churn (issue 40's premise)."""

Sequence = list[tuple[int, int]]
"""(slot, size): the tensor in ``slot`` is replaced by one of ``size`` bytes."""


def churn(
    seed: int = 0,
    tensors: int = 16,
    steps: int = 1500,
    low: int = 256 * KiB,
    high: int = 32 * MiB,
) -> Sequence:
    """The churn: each step resizes the next slot's tensor by x1.05..x1.3 up or down,
    turning at ``high`` and ``low``."""
    rng = random.Random(seed)
    sizes = [rng.randint(low, 4 * low) for _ in range(tensors)]
    growing = [True] * tensors
    out: Sequence = []
    for step in range(steps):
        slot = step % tensors
        factor = rng.uniform(1.05, 1.3)
        size = int(sizes[slot] * factor) if growing[slot] else int(sizes[slot] / factor)
        if size > high:
            growing[slot], size = False, int(sizes[slot] / factor)
        elif size < low:
            growing[slot], size = True, int(sizes[slot] * factor)
        sizes[slot] = size
        out.append((slot, size))
    return out


class Peaks:
    """Peak bytes in use (requested) and reserved over a run, and the time it took
    (the allocations and frees, the reserved-bytes queries excluded)."""

    def __init__(self, slots: int) -> None:
        self.sizes = [0] * slots
        self.in_use = 0
        self.peak_use = 0
        self.peak_reserved = 0
        self.seconds = 0.0
        self.steps = 0

    def allocated(self, size: int) -> None:
        self.in_use += size
        self.peak_use = max(self.peak_use, self.in_use)

    def replaced(self, slot: int, size: int) -> None:
        self.in_use -= self.sizes[slot]
        self.sizes[slot] = size

    def reserved(self, nbytes: int) -> None:
        self.peak_reserved = max(self.peak_reserved, nbytes)

    def timed(self, seconds: float) -> None:
        self.seconds += seconds
        self.steps += 1

    def figures(self) -> dict[str, float]:
        return {
            "peak_in_use": self.peak_use,
            "peak_reserved": self.peak_reserved,
            "ratio": self.peak_reserved / self.peak_use,
            "us_per_step": 1e6 * self.seconds / max(self.steps, 1),
        }


def _slots(sequence: Sequence) -> int:
    return max(slot for slot, _ in sequence) + 1


def pool_logic(config: MemoryConfig, sequence: Sequence) -> dict[str, float]:
    """The churn through the pools of ``config`` on a storage that maps nothing."""
    memory = MemoryManagement(DryStorage(512, 80 << 30, ranges=True), config, owner_id=1)
    peaks = Peaks(_slots(sequence))
    live: list[Any] = [None] * len(peaks.sizes)
    for slot, size in sequence:
        start = time.perf_counter()
        handle = memory.reserve(size)
        live[slot] = handle  # the old tensor is dropped here
        peaks.timed(time.perf_counter() - start)
        peaks.allocated(size)
        peaks.reserved(memory.bytes_reserved)
        peaks.replaced(slot, size)
    memory.close()
    return peaks.figures()


def peak_ratio(config: MemoryConfig, sequence: Sequence) -> float:
    """Peak reserved / peak in use of ``sequence`` through ``config``'s pools."""
    return pool_logic(config, sequence)["ratio"]


async def asynccube_client(device: str, pool: str, sequence: Sequence) -> dict[str, float]:
    """The churn on a real client with ``[memory] pool = pool``."""
    import asynccube as ac

    peaks = Peaks(_slots(sequence))
    live: list[Any] = [None] * len(peaks.sizes)
    async with ac.open_client(device, config={"memory": {"pool": pool}}) as client:
        for slot, size in sequence:
            start = time.perf_counter()
            handle = client.empty(size)
            await client.sync()  # the allocation ran (it is queued by empty)
            peaks.timed(time.perf_counter() - start)
            peaks.allocated(size)
            peaks.reserved((await client.memory_usage()).bytes_reserved)
            live[slot] = handle
            peaks.replaced(slot, size)
        live.clear()
    return peaks.figures()


def torch_worker(sequence: Sequence, device: str) -> dict[str, float]:
    """The churn on PyTorch's caching allocator (run in a process of its own)."""
    import torch

    peaks = Peaks(_slots(sequence))
    live: list[Any] = [None] * len(peaks.sizes)
    for slot, size in sequence:
        start = time.perf_counter()
        tensor = torch.empty(size, dtype=torch.uint8, device=device)
        torch.cuda.synchronize(device)
        peaks.timed(time.perf_counter() - start)
        peaks.allocated(size)
        peaks.reserved(torch.cuda.memory_reserved(device))
        live[slot] = tensor
        peaks.replaced(slot, size)
    torch.cuda.synchronize(device)
    return peaks.figures()


def torch_run(args: argparse.Namespace, expandable: bool) -> dict[str, Any]:
    """:func:`torch_worker` in a subprocess, with or without expandable segments."""
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if expandable:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    cmd = [sys.executable, __file__, "--torch-worker", *_workload_args(args)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _workload_args(args: argparse.Namespace) -> list[str]:
    return [
        f"--device={args.device}", f"--seed={args.seed}", f"--tensors={args.tensors}",
        f"--steps={args.steps}", f"--low={args.low}", f"--high={args.high}",
    ]  # fmt: skip


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cuda:N or host (default: cuda:0 if usable)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tensors", type=int, default=16)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--low", type=int, default=256 * KiB, help="smallest size, bytes")
    parser.add_argument("--high", type=int, default=32 * MiB, help="largest size, bytes")
    parser.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device is None:
        args.device = "cuda:0" if _gpu_usable() else "host"
    return args


def _gpu_usable() -> bool:
    from asynccube._core.runtime.devices import probe_gpus

    return probe_gpus().usable


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every allocator that applies to ``args.device``, on the same sequence."""
    sequence = churn(args.seed, args.tensors, args.steps, args.low, args.high)
    rows: dict[str, Any] = {
        "pool logic: asynccube default (sliced)": pool_logic(MemoryConfig.default(), sequence),
        "pool logic: asynccube expandable": pool_logic(MemoryConfig.expandable(), sequence),
    }
    if args.device.startswith("cuda"):
        for pool in ("default", "expandable"):
            run = asynccube_client(args.device, pool, sequence)
            rows[f"{args.device}: asynccube {pool}"] = asyncio.run(run)
        rows[f"{args.device}: torch default"] = torch_run(args, expandable=False)
        rows[f"{args.device}: torch expandable_segments"] = torch_run(args, expandable=True)
    return {"workload": vars(args) | {"torch_worker": None}, "rows": rows}


def render(figs: dict[str, Any]) -> str:
    """The table, ratios beside the goal."""
    body = []
    for name, row in figs["rows"].items():
        if "error" in row:
            body.append([name, "-", "-", f"not run: {row['error']}", "-"])
            continue
        use, res = row["peak_in_use"] / MiB, row["peak_reserved"] / MiB
        step = f"{row['us_per_step']:.1f}"
        body.append([name, f"{use:.0f} MiB", f"{res:.0f} MiB", f"{row['ratio']:.3f}", step])
    w = figs["workload"]
    head = (
        f"{w['tensors']} tensors, {w['steps']} steps, sizes {w['low'] // KiB} KiB .. "
        f"{w['high'] // MiB} MiB (seed {w['seed']}). Goal: the expandable pool <= {GOAL} "
        f"where the sliced pools reach >= {SLICED_AT_LEAST}.\n\n"
    )
    columns = ["allocator", "peak in use", "peak reserved", "reserved / in use", "µs/step"]
    return head + table(columns, body)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.torch_worker:
        sequence = churn(args.seed, args.tensors, args.steps, args.low, args.high)
        print(json.dumps(torch_worker(sequence, args.device)))
        return 0
    figs = measure(args)
    host = not args.device.startswith("cuda")
    env = environment("" if host else args.device)
    title = "Fragmentation under churn: peak reserved / peak in use (issue 40)"
    write("memory_churn_host" if host else "memory_churn", title, env, render(figs), figs)
    rows = figs["rows"]
    ok = rows["pool logic: asynccube expandable"]["ratio"] <= GOAL
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
