"""``await client.sync()`` after a kernel that keeps the device busy 0, ~10 and ~30 µs,
beside the same launch then a blocking ``cuStreamSynchronize`` (the floor) and torch's
``torch.cuda._sleep`` then ``stream.synchronize()``, in the same run (issue 38).

    python benchmarks/bench_sync.py [--device cuda:0] [--loops asyncio,uvloop] [--rounds 3]

A sync suspends its caller once (tasks cancelled before it unwind first). Where the
device is still busy at the call, that suspension now overlaps the device's work: the
call looks once and the loop iteration that wakes the caller polls
(``cuda/fast_sync.py``); before, the call spun until the device was done and only then
suspended. Each figure: the median of ``CALLS`` rounds of launch then sync, the best
of ``--rounds`` interleaved rounds. Writes ``results/sync_cuda.md|json`` for
``report.py``. Needs a GPU (torch's row needs torch with CUDA); without one it says so
and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import amedian_us, environment, median_us, table, write

import asynccube as ac

CALLS = 2000
CYCLES = (0, 20_000, 60_000)
"""The kernel's busy time in clock cycles (about 0, 10 and 30 µs at 2 GHz)."""

SPIN_SRC = r"""extern "C" __global__ void busy(float* x, unsigned n, unsigned cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < (long long)cycles) {}
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 2.0f * x[i];
}"""
BUSY = ac.Kernel("bench_sync_busy", cuda=ac.CudaSource(SPIN_SRC, entry="busy"))


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


async def _ours(client: ac.ComputeClient, bindings: ac.Bindings) -> float:
    count = ac.CubeCount(1)

    async def launch_and_sync() -> None:
        client.execute(BUSY, count, bindings)
        await client.sync()

    return await amedian_us(launch_and_sync, CALLS)


def _floor(client: ac.ComputeClient, bindings: ac.Bindings, sync: Callable[[], Any]) -> float:
    """The same launch, then the driver's blocking sync of the task's stream."""
    count = ac.CubeCount(1)

    def launch_and_sync() -> None:
        client.execute(BUSY, count, bindings)
        sync()

    return median_us(launch_and_sync, CALLS)


def _torch_sleep(torch: Any, cycles: int) -> float:
    stream = torch.cuda.current_stream()

    def sleep_and_sync() -> None:
        torch.cuda._sleep(cycles)
        stream.synchronize()

    return median_us(sleep_and_sync, CALLS)


async def run(device: str, rounds: int) -> dict[str, Any]:
    from cuda.bindings import driver

    from asynccube._core.values.stream_id import StreamId

    torch = _torch()
    out: dict[str, Any] = {"loop": type(asyncio.get_running_loop()).__module__.split(".")[0]}
    async with ac.open_client(device) as client:
        x = client.create(np.zeros(256, np.float32))
        rows = []
        for cycles in CYCLES:
            bindings = ac.Bindings().with_buffer(x.binding()).with_scalar(np.uint32, [256, cycles])
            client.execute(BUSY, ac.CubeCount(1), bindings)  # compiles, loads
            await client.sync()
            server: Any = client._server  # type: ignore[attr-defined]
            raw = server._streams.streams.get(StreamId.current()).stream
            stream = driver.CUstream(int(raw))

            def sync(stream: Any = stream) -> None:
                (err,) = driver.cuStreamSynchronize(stream)
                assert int(err) == 0, err

            ours, floor, peer = [], [], []
            for _ in range(rounds):
                floor.append(_floor(client, bindings, sync))
                ours.append(await _ours(client, bindings))
                if torch is not None:
                    peer.append(_torch_sleep(torch, cycles))
            rows.append(
                {
                    "cycles": cycles,
                    "ours": min(ours),
                    "floor": min(floor),
                    "torch": min(peer) if peer else None,
                }
            )
        fast = client._fast_sync  # type: ignore[attr-defined]
        out["fast_sync"] = {
            "hits": fast.hits,
            "overlapped": getattr(fast, "overlapped", None),
            "handed": getattr(fast, "handed", None),
            "declined": fast.declined,
        }
    out["rows"] = rows
    return out


def _body(runs: list[dict[str, Any]], device: str, rounds: int, loops: str) -> str:
    rows = []
    for r in runs:
        for row in r["rows"]:
            torch_us = row["torch"]
            rows.append([
                r["loop"], f"{row['cycles']:,}", f"{row['ours']:.2f}", f"{row['floor']:.2f}",
                "-" if torch_us is None else f"{torch_us:.2f}",
                f"{row['ours'] / row['floor']:.2f}x",
                "-" if torch_us is None else f"{row['ours'] / torch_us:.2f}x",
            ])  # fmt: skip
    body = table(
        ["loop", "kernel busy (cycles)", "execute + await sync (µs)",
         "execute + blocking cuStreamSynchronize (µs)", "torch._sleep + synchronize (µs)",
         "vs floor", "vs torch"],
        rows,
    )  # fmt: skip
    counts = "; ".join(f"{r['loop']}: {r['fast_sync']}" for r in runs)
    return body + (
        f"\n\nThe one-call sync's counters (`FastSync`: settled at the call or by the poll of "
        f"the iteration that woke the caller, overlapped, handed to the route, declined): "
        f"{counts}. Goal (issue 38, the tight loop): `await sync` after a launch <= 1.3x the "
        f"C launch + sync. Best of {rounds} interleaved rounds, each the median of {CALLS}. "
        f"`python benchmarks/bench_sync.py --device {device} --loops {loops} --rounds {rounds}`"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--loops", default="asyncio,uvloop")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not args.device.startswith("cuda"):
        print("bench_sync: skipped (needs a GPU)")
        sys.exit(0)
    runs = []
    for loop in args.loops.split(","):
        try:
            if loop == "uvloop":
                try:
                    import uvloop
                except ImportError:
                    continue
                runs.append(uvloop.run(run(args.device, args.rounds)))
            else:
                runs.append(asyncio.run(run(args.device, args.rounds)))
        except ac.AsyncCubeError as exc:  # no usable CUDA device here
            print(f"bench_sync: skipped ({exc})")
            sys.exit(0)
    title = f"await sync after a busy kernel on {args.device} (issue 38)"
    body = _body(runs, args.device, args.rounds, args.loops)
    write("sync_cuda", title, environment(args.device), body, {"runs": runs})


if __name__ == "__main__":
    main()
