"""The loop's time per request of the asynccube service under HTTP load, per phase, each
beside its floor (issue 30): where a request's loop time goes and what it could be.

Per request, the loop time (CPU time on the loop thread) spent in: ``body in`` (aiohttp's
``await request.read()``), ``create`` (``client.create``), ``launch``
(``client.empty`` + ``client.execute``), ``read`` (``client.read``'s call and the
handler's resumption), ``body out`` (from the handler's return: aiohttp builds and sends
the response); the commands the actor runs for a phase count in that phase; and
``completion``, the wall time from awaiting the read to resuming (the device's work and
the wake-up: not loop time). Beside: the loop time that is no request's own, per request
(aiohttp's transport reads, where the HTTP parser takes the body in, and writes; the
actor's own steps; asynccube's callbacks, the completions; the rest), and the loop's busy
share. Floors: the echo server (the body sent back, no compute) under the same load for
body in, body out and the transport, and for create, launch, completion and read the
same calls in a tight loop in the same process, one request at a time, no HTTP.

It wraps asyncio's ``Handle._run`` (each callback's time goes to the request's phase it
ran in, or to its category) and ``Channel.send`` (a command the actor runs counts in the
phase that sent it), so the server runs on asyncio's loop (uvloop's callbacks are
compiled). The first step of an eagerly started task (Python 3.12+) runs inside another
callback: its time up to the handler's first mark counts there.

    python benchmarks/service_profile.py --device cuda:0                  # both workloads
    python benchmarks/service_profile.py --device host --workload small   # no GPU needed

Writes ``results/service_phases.{md,json}`` (``_host`` on the host server).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import weakref
from asyncio import events
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' modules
from _common import environment, table, write

PHASES = ("body_in", "create", "launch", "completion", "read", "body_out")
CATEGORIES = ("transport reads", "transport writes", "asynccube actor", "asynccube callbacks",
              "aiohttp connection tasks", "other")  # fmt: skip


class Profiler:
    """Loop time by request phase and by callback category (see the module docstring)."""

    def __init__(self) -> None:
        self.state: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
        """Per task: [phase, time of the last mark or step start, time the phase began]."""
        self.spent: list[tuple[float, str, float]] = []  # (wall, phase or category, s)
        self.waits: list[tuple[float, float]] = []  # (wall, completion's wall seconds)
        self.answered: list[float] = []  # wall times of the requests entering body_out
        self.claimed = 0.0  # seconds counted already inside the running callback

    def mark(self, phase: str) -> None:
        """The current task enters ``phase``."""
        task, now = asyncio.current_task(), time.perf_counter()
        st = self.state.get(task)
        if st is None:
            self.state[task] = [phase, now, now]
            return
        dt = now - st[1]
        self.spent.append((time.time(), st[0], dt))
        self.claimed += dt
        if st[0] == "completion":
            self.waits.append((time.time(), now - st[2]))
        if phase == "body_out":
            self.answered.append(time.time())
        st[0], st[1], st[2] = phase, now, now

    def install(self) -> None:
        """Wrap ``Handle._run`` and ``Channel.send`` (see the module docstring)."""
        from asynccube._core.channel.channel import Channel

        run, send, prof = events.Handle._run, Channel.send, self

        def timed_run(handle: events.Handle) -> None:
            callback = handle._callback  # type: ignore[attr-defined]
            task = getattr(callback, "__self__", None)
            st = prof.state.get(task) if isinstance(task, asyncio.Task) else None
            outer, prof.claimed = prof.claimed, 0.0
            t0 = time.perf_counter()
            if st is not None:
                st[1] = t0  # the time it was suspended is not its own
            run(handle)
            t1 = time.perf_counter()
            st = prof.state.get(task) if st is not None or isinstance(task, asyncio.Task) else None
            tail = t1 - st[1] if st is not None else 0.0
            if st is not None:
                prof.spent.append((time.time(), st[0], tail))
                st[1] = t1
            own = (t1 - t0) - prof.claimed - tail
            if own > 0:
                prof.spent.append((time.time(), _category(callback, task), own))
            prof.claimed = outer + (t1 - t0)

        def timed_send(channel: Any, op: Any, *args: Any) -> None:
            st = prof.state.get(asyncio.current_task())
            if st is None:
                return send(channel, op, *args)
            phase = st[0]

            def on_actor(*a: Any) -> Any:
                if not channel.in_actor():  # inline: inside the phase's own time
                    return op(*a)
                t = time.perf_counter()
                try:
                    return op(*a)
                finally:
                    dt = time.perf_counter() - t
                    prof.spent.append((time.time(), phase, dt))
                    prof.claimed += dt

            return send(channel, on_actor, *args)

        events.Handle._run = timed_run  # type: ignore[method-assign]
        Channel.send = timed_send  # type: ignore[method-assign]

    def figures(self, lo: float, hi: float, requests: int | None = None) -> dict[str, Any]:
        """Per request in ``[lo, hi]``: loop µs by phase and category, the completion's
        wall ms (p50), the loop's busy share."""
        n = requests or sum(1 for t in self.answered if lo <= t <= hi) or 1
        by: dict[str, float] = defaultdict(float)
        for t, key, s in self.spent:
            if lo <= t <= hi:
                by[key] += s
        waits = [s for t, s in self.waits if lo <= t <= hi]
        return {
            "requests": n,
            "us": {k: v * 1e6 / n for k, v in by.items()},
            "completion_ms": statistics.median(waits) * 1e3 if waits else None,
            "busy": sum(by.values()) / (hi - lo),
        }


def _category(callback: Any, task: Any) -> str:
    if isinstance(task, asyncio.Task):
        if task.get_name() == "asynccube-actor":
            return "asynccube actor"
        coro = getattr(task.get_coro(), "__qualname__", "")
        return "aiohttp connection tasks" if coro.startswith("RequestHandler.") else "other"
    name = getattr(callback, "__qualname__", "")
    if "_read_ready" in name:
        return "transport reads"
    if "_write" in name:
        return "transport writes"
    owner = getattr(callback, "__self__", callback)
    module = getattr(callback, "__module__", None) or type(owner).__module__
    return "asynccube callbacks" if str(module).startswith("asynccube") else "other"


async def _marked_handler(prof: Profiler, work: Any, device: str, stack: list[Any]) -> Any:
    """``_service_work``'s asynccube handler with the phases marked."""
    from _service_work import asynccube_parts

    p = await asynccube_parts(work, device, stack)
    client, kernel, count, nbytes, mark = p.client, p.kernel, p.count, p.nbytes, prof.mark

    async def handle(body: bytes) -> bytes:
        mark("create")
        x = client.create(body)
        mark("launch")
        y = client.empty(nbytes)
        client.execute(kernel, count, p.bindings(x, y))
        mark("read")
        fut = client.read([y])
        mark("completion")
        (out,) = await fut
        mark("read")
        return out  # type: ignore[no-any-return]

    await handle(bytes(nbytes))  # compile and load
    return handle, f"asynccube on {client.device} (phases marked)"


def serve(peer: str, work_name: str, iters: int, device: str, floor_s: float) -> None:
    """The profiled service; answers ``lo hi`` lines on stdin with its figures (for
    asynccube, with the tight loop's floors measured before it serves)."""
    import _service_app as app
    from _service_work import workload

    prof = Profiler()
    work = workload(work_name, iters)
    floors: dict[str, Any] = {}

    async def make(peer_: str, work_: Any, dev: str, stack: list[Any]) -> Any:
        if peer_ != "asynccube":
            return await app_make(peer_, work_, dev, stack)
        handle, info = await _marked_handler(prof, work_, dev, stack)
        floors.update(await _tight_loop(prof, handle, work_, floor_s))
        return handle, info

    app_make, app.make_handler = app.make_handler, make

    async def main() -> None:
        prof.install()
        served = app.serve(peer, device, work=work, probe=prof.mark)
        await app.answer_windows(served, lambda lo, hi: {**prof.figures(lo, hi), **floors})

    asyncio.run(main())


async def _tight_loop(prof: Profiler, handle: Any, work: Any, seconds: float) -> dict[str, Any]:
    """The handler called one request at a time for ``seconds``: the per-call floors."""
    body = work.inputs(1)[0]

    async def loop() -> int:
        n, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            await handle(body)
            prof.mark("between")
            n += 1
        return n

    lo = time.time()
    n = await asyncio.create_task(loop())
    return {"floor": prof.figures(lo, time.time(), n)}


def measure(args: argparse.Namespace, peer: str, work: str) -> dict[str, Any] | str:
    """One profiled server under ``bench_service``'s load; its figures and the load's."""
    from bench_service import load_instrumented

    cmd = [sys.executable, __file__, "--serve", peer, "--workload", work, "--iters",
           str(args.iters), "--device", args.device, "--floor-seconds",
           str(args.floor_seconds)]  # fmt: skip
    done = load_instrumented(cmd, args, work, echo=peer == "echo")
    if isinstance(done, str):
        return done
    outs, stats, figures = done
    figures["requests_per_s"] = sum(len(o["latencies_us"]) for o in outs) / args.seconds
    figures["wrong"] = sum(o["mismatches"] + o["errors"] for o in outs)
    figures["lag_p99_ms"] = stats["lag_p99_ms"]
    return figures


ROWS = (
    ("body in (`await request.read()`)", "body_in", "echo"),
    ("create (`client.create`)", "create", "tight"),
    ("launch (`client.empty` + `client.execute`)", "launch", "tight"),
    ("read (`client.read`'s call, the resumption)", "read", "tight"),
    ("body out (response built and sent)", "body_out", "echo"),
    ("transport reads (HTTP parser, the body's bytes)", "transport reads", "echo"),
    ("transport writes", "transport writes", "echo"),
    ("aiohttp connection tasks", "aiohttp connection tasks", "echo"),
    ("asynccube actor (its own steps)", "asynccube actor", "tight"),
    ("asynccube callbacks (completions)", "asynccube callbacks", "tight"),
)
FLOOR = {"echo": "echo server, same load", "tight": "same calls, tight loop, no HTTP"}


def _us(figures: dict[str, Any] | None, key: str) -> str:
    if figures is None:
        return "-"
    return f"{figures['us'].get(key, 0.0):.1f}"


def render(work: str, ours: dict[str, Any] | str, echo: dict[str, Any] | str) -> str:
    """The phase table of one workload (or why it could not be measured)."""
    if isinstance(ours, str):
        return f"asynccube: {ours}"
    e = echo if isinstance(echo, dict) else None
    tight = ours.get("floor")
    rows = [[name, _us(ours, key), _us(e if floor == "echo" else tight, key), FLOOR[floor]]
            for name, key, floor in ROWS]  # fmt: skip
    done = set(PHASES) | {key for _, key, _ in ROWS} | {"between"}
    rest = {k: v for k, v in ours["us"].items() if k not in done}
    echo_rest = {k: v for k, v in e["us"].items() if k not in done} if e else {}
    rows.append(["other (handler glue, the lag probe, timers)", f"{sum(rest.values()):.1f}",
                 f"{sum(echo_rest.values()):.1f}" if e else "-", FLOOR["echo"]])  # fmt: skip
    total = sum(v for k, v in ours["us"].items() if k != "between")
    echo_total = f"{sum(e['us'].values()):.1f}" if e else "-"
    rows.append(["**total loop time per request**", f"{total:.1f}", echo_total, FLOOR["echo"]])
    wait = ours.get("completion_ms")
    floor_wait = tight.get("completion_ms") if tight else None
    ms = ["-" if w is None else f"{w:.3f} ms" for w in (wait, floor_wait)]
    rows.append(["completion (wall ms p50: device and wake-up, not loop time)", *ms,
                 FLOOR["tight"]])  # fmt: skip
    served = (f"asynccube {ours['requests_per_s']:.0f} requests/s, loop busy "
              f"{100 * ours['busy']:.0f}%, lag p99 {ours['lag_p99_ms']:.2f} ms, "
              f"{ours['wrong']} wrong")  # fmt: skip
    if e:
        served += (f"; echo {e['requests_per_s']:.0f} requests/s, loop busy "
                   f"{100 * e['busy']:.0f}%, {e['wrong']} wrong")  # fmt: skip
    elif isinstance(echo, str):
        served += f"; echo: {echo}"
    head = [f"{work}: phase", "asynccube under load, loop µs per request", "floor µs", "floor"]
    return f"{table(head, rows)}\n\n{served}."


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--device", default="host")
    p.add_argument("--workload", default="both", choices=("both", "small", "compute"))
    p.add_argument("--iters", type=int, default=0, help="as bench_service.py's")
    p.add_argument("--kernel-ms", type=float, default=1.0)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--floor-seconds", type=float, default=0.5)
    p.add_argument("--json-only", action="store_true", help="print the figures, write nothing")
    args = p.parse_args()
    if args.serve:
        serve(args.serve, args.workload, args.iters, args.device, args.floor_seconds)
        return
    from bench_service import calibrate

    works = ["small", "compute"] if args.workload == "both" else [args.workload]
    kernel = calibrate(args) if "compute" in works else {}
    figures = {w: {peer: measure(args, peer, w) for peer in ("asynccube", "echo")} for w in works}
    if args.json_only:
        print(json.dumps({**figures, "kernel": kernel}))
        return
    body = "\n\n".join(render(w, f["asynccube"], f["echo"]) for w, f in figures.items())
    how = (f"{args.clients} clients from {args.procs} load processes on loopback, "
           f"{args.warmup:g} s warm-up then {args.seconds:g} s measured; asyncio's loop; the "
           f"tight loop ran {args.floor_seconds:g} s. Compute kernel: {kernel.get('iters')} "
           f"iterations ({kernel.get('how')}). Command: `python benchmarks/service_profile.py "
           f"--device {args.device}`.")  # fmt: skip
    device = args.device if args.device != "host" else ""
    name = "service_phases" + ("" if device else "_host")
    write(name, f"The service loop per phase (issue 30), device {args.device}",
          environment(device), f"{body}\n\n{how}", {"results": figures, "kernel": kernel,
          "args": vars(args)})  # fmt: skip


if __name__ == "__main__":
    main()
