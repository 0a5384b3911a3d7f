"""Where an asynccube service request spends its time, under load, and what the batch
budget trades: ``bench_service.py``'s asynccube service with each awaited command timed.

For every command the handler awaits (its ``read``) the server records four spans:
``call`` (handler start to the command being sent), ``queue`` (sent to run by the actor or
inline), ``device`` (run to its future resolved: the device's work and the loop noticing
it) and ``wake`` (resolved to the handler resuming). One line per run: requests/s, client
latency p50, the server loop's lag p99, the handler's p50 / p99 and the spans' p50 (ms).

    python benchmarks/service_phases.py --loop uvloop --clients 64 --batch-us 1000 200
    python benchmarks/service_phases.py --device host --clients 8     # no GPU needed

Diagnostic: it wraps ``Channel.request`` in the server process; figures are not written
to ``results/``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # bench_service and _service_app beside this file
SPANS = (("call", "start", "sent"), ("queue", "sent", "run"), ("device", "run", "done"),
         ("wake", "done", "resumed"))  # fmt: skip


def _p(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def _record_commands(records: list[dict[str, Any]]) -> None:
    """Time every awaited command of the server's channel (see the module docstring)."""
    from asynccube._core.channel import channel

    request = channel.Channel.request

    def timed(self: channel.Channel, op: Any, *args: Any) -> Any:
        rec: dict[str, Any] = {"sent": time.perf_counter(), "task": asyncio.current_task()}

        def run(*a: Any) -> Any:
            rec["run"] = time.perf_counter()
            return op(*a)

        fut = request(self, run, *args)
        fut.add_done_callback(lambda _: rec.__setitem__("done", time.perf_counter()))
        records.append(rec)
        return fut

    channel.Channel.request = timed  # type: ignore[method-assign]


def serve(loop: str, device: str, batch_us: int) -> None:
    """The service, answering ``lo hi`` lines on stdin with the handler's spans."""
    import _service_app as app
    from _service_work import _asynccube

    records: list[dict[str, Any]] = []
    handled: list[tuple[float, float, dict[str, Any] | None]] = []
    _record_commands(records)

    async def timed_handler(peer: str, work: Any, dev: str, stack: list[Any]) -> Any:
        handle, info = await _asynccube(work, dev, stack, batch_us)

        async def timed(body: bytes) -> bytes:
            start, task, mark = time.perf_counter(), asyncio.current_task(), len(records)
            out = await handle(body)
            mine = [r for r in records[mark:] if r["task"] is task]
            rec = mine[-1] if mine else None
            if rec is not None:
                rec.update(start=start, resumed=time.perf_counter(), task=None)
            handled.append((time.time(), time.perf_counter() - start, rec))
            return out

        return timed, info

    app.make_handler = timed_handler

    def figures(lo: float, hi: float) -> dict[str, Any]:
        inside = [(t, rec) for w, t, rec in handled if lo <= w <= hi]
        spans = {name: _p([r[b] - r[a] for _, r in inside if r and "run" in r], 0.5) * 1e3
                 for name, a, b in SPANS}  # fmt: skip
        times = [t for t, _ in inside]
        return {"p50": _p(times, 0.5) * 1e3, "p99": _p(times, 0.99) * 1e3, "spans": spans}

    async def main() -> None:
        await app.answer_windows(app.serve("asynccube", device), figures)

    if loop == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


def measure(args: argparse.Namespace, batch_us: int) -> str:
    """One run of the service under load (``bench_service.apply_load``); its figures."""
    from bench_service import load_instrumented

    cmd = [sys.executable, __file__, "--serve", "--loop", args.loop, "--device", args.device,
           "--batch-us", str(batch_us)]  # fmt: skip
    done = load_instrumented(cmd, args)
    if isinstance(done, str):
        return f"batch_us {batch_us}: {done}"
    outs, stats, handler = done
    lat = sorted(x for o in outs for x in o["latencies_us"])
    bad = sum(o["mismatches"] + o["errors"] for o in outs)
    spans = " ".join(f"{k} {v:.2f}" for k, v in handler["spans"].items())
    return (f"{args.loop} clients {args.clients} batch_us {batch_us}: {len(lat) / args.seconds:.0f}"
            f" requests/s, p50 {_p(lat, 0.5) / 1e3:.2f} ms, loop lag p99 "
            f"{stats['lag_p99_ms']:.2f} ms; handler p50 {handler['p50']:.2f} p99 "
            f"{handler['p99']:.2f} ms; spans p50 ms: {spans}; {bad} wrong")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--loop", default="asyncio", choices=("asyncio", "uvloop"))
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--warmup", type=float, default=1.5)
    p.add_argument("--batch-us", type=int, nargs="+", default=[1000])
    args = p.parse_args()
    if args.serve:
        serve(args.loop, args.device, args.batch_us[0])
        return
    for batch_us in args.batch_us:
        print(measure(args, batch_us), flush=True)


if __name__ == "__main__":
    main()
