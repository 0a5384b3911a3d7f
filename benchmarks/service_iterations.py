"""How long the service's loop iterations take under load, and what runs in the long
ones: why the loop lag of ``bench_service.py``'s services is what it is.

The lag probe sleeps 1 ms; it wakes in the iteration after its timer is due, so its lag
is about one to two iterations. asyncio runs every callback that is ready when an
iteration starts, so an iteration's length is the work of every request that got ready
meanwhile. This runs one service (asyncio's loop: it wraps ``Handle._run`` and
``BaseEventLoop._run_once``; uvloop's are compiled) under ``bench_service``'s load and
prints, per service: requests/s, the lag p99, the share of iterations by length (ms) and
the loop time spent in iterations over 2 ms by callback (a task step is named by its
coroutine; ``_handle_request`` is aiohttp's, running the handler up to its first
suspension: reading the body, the GPU work that runs inline, sending the response).

    python benchmarks/service_iterations.py --peers asynccube,numpy_loop --admit 4

Diagnostic: figures are not written to ``results/``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import time
from asyncio import base_events, events
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # bench_service and _service_app beside this file
LONG_S = 0.002


def _name(callback: Any) -> str:
    task = getattr(callback, "__self__", None)
    if isinstance(task, asyncio.Task):
        return "task " + getattr(task.get_coro(), "__qualname__", "?")
    return str(getattr(callback, "__qualname__", type(callback).__name__))


def _instrument(iterations: list[tuple[float, float]], long: list[list[Any]]) -> None:
    """Record every iteration (end wall time, seconds) and the callbacks of long ones."""
    ran: list[tuple[str, float]] = []
    run, once = events.Handle._run, base_events.BaseEventLoop._run_once

    def timed_run(self: events.Handle) -> None:
        t = time.perf_counter()
        run(self)
        ran.append((_name(self._callback), time.perf_counter() - t))  # type: ignore[attr-defined]

    def timed_once(self: base_events.BaseEventLoop) -> None:
        ran.clear()
        t = time.perf_counter()
        once(self)  # type: ignore[attr-defined]
        took = time.perf_counter() - t
        iterations.append((time.time(), took))
        if took > LONG_S:
            long.append([time.time(), *ran])

    events.Handle._run = timed_run  # type: ignore[method-assign]
    base_events.BaseEventLoop._run_once = timed_once  # type: ignore[attr-defined]


def serve(peer: str, device: str, admit: int) -> None:
    """The service, answering ``lo hi`` lines on stdin with its iterations' figures."""
    import _service_app as app

    iterations: list[tuple[float, float]] = []
    long: list[list[Any]] = []

    async def main() -> None:
        _instrument(iterations, long)
        await app.answer_windows(
            app.serve(peer, device, False, admit),
            lambda lo, hi: _figures(iterations, long, lo, hi),
        )

    asyncio.run(main())


def _figures(
    iterations: list[tuple[float, float]], long: list[list[Any]], lo: float, hi: float
) -> dict[str, Any]:
    took = [s for t, s in iterations if lo <= t <= hi]
    by_ms = collections.Counter(min(int(s * 1e3), 10) for s in took)
    share = {f"{ms}{'+' if ms == 10 else ''}": round(100 * n / len(took), 1)
             for ms, n in sorted(by_ms.items())}  # fmt: skip
    spent: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for t, *ran in long:
        if lo <= t <= hi:
            for name, s in ran:
                spent[name][0] += 1
                spent[name][1] += s
    top = sorted(spent.items(), key=lambda kv: -kv[1][1])[:6]
    return {
        "iterations": len(took),
        "share_by_ms": share,
        "long_ms_per_s": sum(s for s in took if s > LONG_S) * 1e3 / (hi - lo),
        "long_by_callback": [(n, int(c), round(s * 1e3 / (hi - lo), 2)) for n, (c, s) in top],
    }


def measure(args: argparse.Namespace, peer: str) -> str:
    """One run of ``peer`` under load (``bench_service.apply_load``); its figures."""
    from bench_service import load_instrumented

    cmd = [sys.executable, __file__, "--serve", peer, "--device", args.device,
           "--admit", str(args.admit)]  # fmt: skip
    done = load_instrumented(cmd, args)
    if isinstance(done, str):
        return f"{peer}: {done}"
    outs, stats, f = done
    served = sum(len(o["latencies_us"]) for o in outs) / args.seconds
    bad = sum(o["mismatches"] + o["errors"] for o in outs)
    top = "; ".join(f"{n} {c}x {ms} ms/s" for n, c, ms in f["long_by_callback"])
    return (f"{peer} (admit {args.admit or 'all'}): {served:.0f} requests/s, loop lag p99 "
            f"{stats['lag_p99_ms']:.2f} ms, {bad} wrong; {f['iterations']} iterations, % by ms:"
            f" {f['share_by_ms']}; in iterations over {LONG_S * 1e3:g} ms: "
            f"{f['long_ms_per_s']:.0f} ms/s, by callback: {top}")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--peers", default="asynccube,numpy_loop")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--admit", type=int, default=0)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--warmup", type=float, default=1.5)
    args = p.parse_args()
    if args.serve:
        serve(args.serve, args.device, args.admit)
        return
    for peer in args.peers.split(","):
        print(measure(args, peer), flush=True)


if __name__ == "__main__":
    main()
