"""Awaiting another library's GPU work: ``await client.wait(torch_stream)``, beside what
a torch user does without asynccube, in the same run (issue 26's two figures).

    python benchmarks/bench_wait.py [--device cuda:0] [--seconds 1.0] [--rounds 5]

1. Long wait: a torch stream runs ``--seconds`` of float32 matmuls; the loop awaits it.
   Loop lag p99 (a ticker's lateness, 1 ms period) and process CPU time during the
   wait (a second pass, without the ticker), beside ``stream.synchronize()`` on the loop
   and in a worker thread (``asyncio.to_thread``). Goals: lag p99 <= 1 ms, CPU <= 10%
   of a core.
2. Short wait: one tiny torch kernel, then ``await client.wait(stream)``, beside the
   same kernel then a raw ``cuEventRecord`` + blocking ``cuEventSynchronize`` (and
   torch's ``stream.synchronize()``); ``--rounds`` rounds of the median of 2000 calls,
   interleaved. Goal: <= 1.3x the raw event.

Needs torch with CUDA; without it (or without a GPU) it says so and exits 0. Writes
``results/wait_cuda.md|json`` for ``report.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _common import amedian_us, environment, median_us, table, write

import asynccube as ac

CALLS = 2000


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


class Matmuls:
    """Queues about ``seconds`` of float32 matmuls on a stream (calibrated once)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.a = torch.randn(4096, 4096, device="cuda")
        self.b = torch.randn(4096, 4096, device="cuda")
        for _ in range(3):
            self.a @ self.b
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(10):
            self.a @ self.b
        torch.cuda.synchronize()
        self.each = (time.perf_counter() - start) / 10

    def queue(self, stream: Any, seconds: float) -> None:
        with self.torch.cuda.stream(stream):
            for _ in range(max(1, round(seconds / self.each))):
                self.a @ self.b


async def _lag_p99_ms(wait: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """(p99, max) lateness in ms of a 1 ms ticker while ``wait()`` runs."""
    loop = asyncio.get_running_loop()
    late: list[float] = []
    done = False

    def tick(due: float) -> None:
        late.append(loop.time() - due)
        if not done:
            loop.call_at(due + 0.001, tick, due + 0.001)

    start = loop.time() + 0.001
    loop.call_at(start, tick, start)
    await wait()
    done = True
    late.sort()
    p99 = late[min(len(late) - 1, int(len(late) * 0.99))] if late else 0.0
    return p99 * 1e3, (late[-1] if late else 0.0) * 1e3


async def _cpu_share(wait: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """(process CPU seconds / wall seconds, wall seconds) while ``wait()`` runs."""
    cpu, wall = time.process_time(), time.perf_counter()
    await wait()
    return (time.process_time() - cpu) / (time.perf_counter() - wall), time.perf_counter() - wall


async def long_wait(client: ac.ComputeClient, mm: Matmuls, seconds: float) -> dict[str, Any]:
    stream = mm.torch.cuda.Stream()

    async def ours() -> None:
        await client.wait(stream)

    async def on_loop() -> None:
        stream.synchronize()

    async def in_thread() -> None:
        await asyncio.to_thread(stream.synchronize)

    out: dict[str, Any] = {}
    for name, wait in (("client.wait", ours), ("to_thread(sync)", in_thread),
                       ("sync on the loop", on_loop)):  # fmt: skip
        mm.queue(stream, seconds)
        p99, worst = await _lag_p99_ms(wait)
        assert stream.query(), f"{name} returned before the stream's work was done"
        mm.queue(stream, seconds)
        share, wall = await _cpu_share(wait)
        out[name] = {"lag_p99_ms": p99, "lag_max_ms": worst, "cpu_share": share, "wall_s": wall}
    return out


async def short_wait(client: ac.ComputeClient, torch: Any, rounds: int) -> dict[str, Any]:
    from cuda.bindings import driver

    stream = torch.cuda.Stream()
    x = torch.zeros(1, device="cuda")
    flags = int(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)
    err, event = driver.cuEventCreate(flags)
    assert not err
    handle = stream.cuda_stream

    def raw() -> None:
        with torch.cuda.stream(stream):
            x.add_(1)
        driver.cuEventRecord(event, handle)
        driver.cuEventSynchronize(event)

    def torch_sync() -> None:
        with torch.cuda.stream(stream):
            x.add_(1)
        stream.synchronize()

    async def ours() -> None:
        with torch.cuda.stream(stream):
            x.add_(1)
        await client.wait(stream)

    runs: dict[str, list[float]] = {"raw": [], "torch": [], "client.wait": []}
    for _ in range(rounds + 1):  # the first round warms up, and is dropped
        runs["raw"].append(median_us(raw, CALLS))
        runs["torch"].append(median_us(torch_sync, CALLS))
        runs["client.wait"].append(await amedian_us(ours, CALLS))
    driver.cuEventDestroy(event)
    out = {k: v[1:] for k, v in runs.items()}
    out["ratios"] = [w / r for w, r in zip(out["client.wait"], out["raw"], strict=True)]
    return out


async def run(device: str, seconds: float, rounds: int) -> tuple[str, dict[str, Any]]:
    torch = _torch()
    assert torch is not None
    mm = Matmuls(torch)
    async with ac.open_client(device) as client:
        await client.wait(torch.cuda.current_stream())  # warm: the notifier, the events
        longs = await long_wait(client, mm, seconds)
        shorts = await short_wait(client, torch, rounds)
    rows = [
        [f"await a {seconds:g} s matmul loop: {name}", f"{v['lag_p99_ms']:.3f}",
         f"{v['lag_max_ms']:.2f}", f"{v['cpu_share'] * 100:.1f}%", f"{v['wall_s']:.2f}"]
        for name, v in longs.items()
    ]  # fmt: skip
    ours = longs["client.wait"]
    body = table(["wait", "loop lag p99 (ms)", "lag max (ms)", "CPU (of a core)", "wall (s)"], rows)
    body += (
        f"\n\nGoals: lag p99 <= 1 ms ({ours['lag_p99_ms']:.3f}: "
        f"{'met' if ours['lag_p99_ms'] <= 1 else 'MISSED'}), CPU <= 10% of a core "
        f"({ours['cpu_share'] * 100:.1f}%: {'met' if ours['cpu_share'] <= 0.1 else 'MISSED'}).\n\n"
    )
    ratio = statistics.median(shorts["ratios"])
    short_rows = [
        ["tiny torch kernel + cuEventRecord + cuEventSynchronize (blocking)",
         _us(shorts["raw"]), "1.00x"],
        ["tiny torch kernel + stream.synchronize() (blocking)", _us(shorts["torch"]),
         f"{statistics.median(shorts['torch']) / statistics.median(shorts['raw']):.2f}x"],
        ["tiny torch kernel + await client.wait(stream)", _us(shorts["client.wait"]),
         f"{ratio:.2f}x"],
    ]  # fmt: skip
    body += table(["round trip", "median µs per round", "vs raw"], short_rows)
    body += (
        f"\n\nGoal: <= 1.3x the raw event ({ratio:.2f}x: {'met' if ratio <= 1.3 else 'MISSED'}); "
        f"each round the median of {CALLS} calls, {rounds} rounds interleaved. "
        f"`python benchmarks/bench_wait.py --device {device} --seconds {seconds:g} "
        f"--rounds {rounds}`"
    )
    return body, {"long_wait": longs, "short_wait": shorts, "short_ratio": ratio}


def _us(values: list[float]) -> str:
    return " / ".join(f"{v:.1f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if _torch() is None or not args.device.startswith("cuda"):
        print("bench_wait: skipped (needs torch with CUDA and a GPU)")
        sys.exit(0)
    body, figures = asyncio.run(run(args.device, args.seconds, args.rounds))
    title = f"Awaiting another library's GPU work on {args.device}"
    write("wait_cuda", title, environment(args.device), body, figures)


if __name__ == "__main__":
    main()
