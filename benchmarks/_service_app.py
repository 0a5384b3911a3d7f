"""The processes of ``bench_service.py``: one service (``serve PEER``), one load
generator (``load URL``), one service's handler called with no HTTP (``direct PEER``) or
the compute kernel's calibration (``calibrate``). Run by bench_service.py, not by hand.
The workloads and the handlers: ``_service_work.py``.

``serve PEER --workload W --loop L --device D`` prints ``PORT n`` once it listens on
127.0.0.1 (or ``SKIP reason`` and exits when PEER cannot run here), then serves
``POST /y`` and ``GET /stats?since=T0&until=T1`` (over that wall-clock window: the loop
lag probe's p99/max, and the garbage collector's pauses, which stop the loop too:
milliseconds per second, the longest, and the full collections; and since the start, the
most requests inside the handler at once). With ``--gc-freeze`` the server calls
``gc.freeze()`` once it is ready (what a service does to keep its start-up objects out
of every later collection). With ``--admit N`` at most N requests are inside the
handler at once; the others wait, their bodies unread (what a service does to bound the
work one loop iteration takes on).

``load URL --clients K --seconds S`` prints ``READY`` once its bodies are made, reads the
start time T from stdin, runs K concurrent clients until ``T + S``, counts the requests
completed inside ``[T, T + S]``, checks every response (``_service_work.Checker``; with
``--echo``: against the body sent) and prints one JSON object.

``direct PEER --tasks K --warmup W --seconds S --runs N`` runs K tasks in one loop
calling the handler directly for W + N S seconds (no HTTP) and prints the figures of
each of the N windows of S seconds after the warm-up, with the loop's lag (a handler
that never suspends starves the probe: its lag is counted at the time it was due).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _service_work import Checker, Workload, asynccube_parts, make_handler, workload

Probe = Callable[[str], None]
"""Called with a phase name as a request enters it (``body_in``, ``compute``,
``body_out``): ``service_profile.py``'s marks."""


async def _lag_probe(samples: list[tuple[float, float]]) -> None:
    while True:
        t0 = time.perf_counter()
        await asyncio.sleep(0.001)
        late = time.perf_counter() - t0 - 0.001
        samples.append((time.time() - late, late))  # when it was due, how late it woke


def _gc_probe(pauses: list[tuple[float, int, float]]) -> Callable[[str, Any], None]:
    """A ``gc.callbacks`` entry recording (wall time, generation, seconds) per pause."""
    started = [0.0]

    def on_gc(phase: str, info: Any) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((time.time(), int(info["generation"]), time.perf_counter() - started[0]))

    return on_gc


def _window_stats(
    lags: list[tuple[float, float]], pauses: list[tuple[float, int, float]], lo: float, hi: float
) -> dict[str, Any]:
    window = sorted(lag for t, lag in lags if lo <= t <= hi) or [0.0]
    p99 = window[min(len(window) - 1, int(0.99 * len(window)))]
    gcs = [(gen, s) for t, gen, s in pauses if lo <= t <= hi]
    return {
        "lag_p99_ms": p99 * 1e3,
        "lag_max_ms": window[-1] * 1e3,
        "gc_ms_per_s": sum(s for _, s in gcs) * 1e3 / max(hi - lo, 1e-9),
        "gc_max_ms": max((s for _, s in gcs), default=0.0) * 1e3,
        "gc_full": sum(1 for gen, _ in gcs if gen == 2),
    }


async def serve(
    peer: str,
    device: str,
    freeze: bool = False,
    admit: int = 0,
    work: Workload | None = None,
    probe: Probe | None = None,
) -> None:
    """Serve ``peer``'s handler of ``work`` (default: the small workload) until
    cancelled (see the module docstring); ``probe``: see :data:`Probe`."""
    from aiohttp import web

    stack: list[Any] = []
    try:
        handle, info = await make_handler(peer, work or workload("small"), device, stack)
    except Exception as exc:
        print(f"SKIP {type(exc).__name__}: {exc}".replace("\n", " ")[:300], flush=True)
        return
    lags: list[tuple[float, float]] = []
    pauses: list[tuple[float, int, float]] = []
    lag_task = asyncio.create_task(_lag_probe(lags))
    gc.callbacks.append(_gc_probe(pauses))

    gate = asyncio.Semaphore(admit) if admit > 0 else None
    inside = [0, 0]  # requests in the handler now, and the most at once

    async def compute(request: web.Request) -> web.Response:
        inside[0] += 1
        inside[1] = max(inside[1], inside[0])
        try:
            if probe is None:
                return web.Response(body=await handle(await request.read()))
            probe("body_in")
            body = await request.read()
            probe("compute")
            out = await handle(body)
            probe("body_out")
            return web.Response(body=out)
        finally:
            inside[0] -= 1

    async def y(request: web.Request) -> web.Response:
        if gate is None:
            return await compute(request)
        async with gate:
            return await compute(request)

    async def stats(request: web.Request) -> web.Response:
        lo, hi = float(request.query["since"]), float(request.query["until"])
        stats = {**_window_stats(lags, pauses, lo, hi), "handler_max": inside[1]}
        return web.json_response({**stats, "info": info})

    app = web.Application(client_max_size=4 << 20)
    app.add_routes([web.post("/y", y), web.get("/stats", stats)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
    await site.start()
    port = runner.addresses[0][1]
    if freeze:
        gc.collect()
        gc.freeze()
    print(f"PORT {port}", flush=True)
    try:
        await asyncio.Event().wait()  # until terminated
    finally:
        lag_task.cancel()
        await runner.cleanup()
        for client in stack:
            await client.close()


async def answer_windows(
    server: Awaitable[None], figures: Callable[[float, float], dict[str, Any]]
) -> None:
    """Run ``server`` (a ``serve`` coroutine) and answer each ``lo hi`` line on stdin with
    one JSON line, ``figures(lo, hi)`` over that wall-clock window, until stdin closes or
    the server ends (the instrumented services of ``service_phases.py`` and
    ``service_iterations.py``, driven by ``bench_service.load_instrumented``)."""
    task = asyncio.ensure_future(server)
    reader = asyncio.get_running_loop().run_in_executor
    while not task.done():
        line = await reader(None, sys.stdin.readline)
        if not line:
            break
        lo, hi = map(float, line.split())
        print(json.dumps(figures(lo, hi)), flush=True)


async def load(
    url: str, clients: int, start: float, seconds: float, bodies: list[bytes], check: Checker
) -> dict[str, Any]:
    """``clients`` concurrent clients posting ``bodies`` to ``url`` until ``start +
    seconds``; their latencies in the window and the checks (see the module docstring)."""
    import aiohttp

    end = start + seconds
    out: dict[str, Any] = {"latencies_us": [], "checked": 0, "mismatches": 0, "errors": 0,
                           "first_error": ""}  # fmt: skip
    conn = aiohttp.TCPConnector(limit=clients)

    async def client(k: int, session: aiohttp.ClientSession) -> None:
        i = k
        while time.time() < end:
            which = i % len(bodies)
            i += 1
            t0 = time.perf_counter()
            try:
                async with session.post(f"{url}/y", data=bodies[which]) as resp:
                    got = await resp.read()
                    status = resp.status
            except Exception as exc:
                out["errors"] += 1
                out["first_error"] = out["first_error"] or repr(exc)[:200]
                continue
            t1 = time.perf_counter()
            done = time.time()
            out["checked"] += 1
            if status != 200 or not check.ok(which, got):
                out["mismatches"] += 1
                out["first_error"] = out["first_error"] or f"status {status}, {len(got)} bytes"
            elif start <= done <= end:
                out["latencies_us"].append(round((t1 - t0) * 1e6))

    async with aiohttp.ClientSession(connector=conn) as session:
        await asyncio.gather(*(client(k, session) for k in range(clients)))
    return out


async def direct(
    peer: str, work: Workload, device: str, tasks: int, warmup: float, seconds: float, runs: int
) -> list[dict[str, Any]]:
    """``tasks`` tasks calling ``peer``'s handler in this loop (see the module docstring),
    ``runs`` windows of ``seconds`` one after the other: the figures of each."""
    stack: list[Any] = []
    try:
        handle, info = await make_handler(peer, work, device, stack)
    except Exception as exc:
        return [{"skipped": f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]}]
    lags: list[tuple[float, float]] = []
    lag_task = asyncio.create_task(_lag_probe(lags))
    bodies = work.inputs()
    check = Checker(work, bodies)
    first = time.time() + warmup
    windows = [(first + k * seconds, first + (k + 1) * seconds) for k in range(runs)]
    end = windows[-1][1]
    outs = [{"checked": 0, "mismatches": 0, "errors": 0, "first_error": "", "lat": []}
            for _ in windows]  # fmt: skip

    def window(t: float) -> dict[str, Any]:
        return outs[min(runs - 1, max(0, int((t - first) // seconds)))]

    async def worker(k: int) -> None:
        i = k
        while time.time() < end:
            which = i % len(bodies)
            i += 1
            t0 = time.perf_counter()
            got = await handle(bodies[which])
            t1, now = time.perf_counter(), time.time()
            out = window(now)
            out["checked"] += 1
            if not check.ok(which, got):
                out["mismatches"] += 1
                out["first_error"] = out["first_error"] or f"{len(got)} bytes, wrong values"
            elif first <= now <= end:
                out["lat"].append(t1 - t0)

    try:
        await asyncio.gather(*(worker(k) for k in range(tasks)))
        await asyncio.sleep(0.002)  # the probe's last sample
    finally:
        lag_task.cancel()
        for client in stack:
            await client.close()
    return [_direct_figures(out, lags, lo, hi, f"{info}, {tasks} tasks, no HTTP")
            for out, (lo, hi) in zip(outs, windows, strict=True)]  # fmt: skip


def _direct_figures(
    out: dict[str, Any], lags: list[tuple[float, float]], lo: float, hi: float, info: str
) -> dict[str, Any]:
    lat = sorted(out.pop("lat"))
    stats = _window_stats(lags, [], lo, hi)
    return {
        **out,
        "requests_per_s": len(lat) / (hi - lo),
        "p50_ms": lat[len(lat) // 2] * 1e3 if lat else None,
        "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3 if lat else None,
        "loop_lag_p99_ms": stats["lag_p99_ms"],
        "loop_lag_max_ms": stats["lag_max_ms"],
        "server": info,
    }


async def calibrate(device: str, iters: int, target_ms: float) -> dict[str, Any]:
    """The compute kernel's time on ``device`` (back-to-back launches, one stream) at
    ``iters`` iterations, then at the count scaled to ``target_ms``."""
    stack: list[Any] = []

    async def kernel_ms(n: int) -> float:
        p = await asynccube_parts(workload("compute", n), device, stack)
        x, y = p.client.create(bytes(p.nbytes)), p.client.empty(p.nbytes)
        bindings = p.bindings(x, y)
        p.client.execute(p.kernel, p.count, bindings)  # compile and load
        await p.client.sync()
        t0 = time.perf_counter()
        for _ in range(20):
            p.client.execute(p.kernel, p.count, bindings)
        await p.client.sync()
        return (time.perf_counter() - t0) / 20 * 1e3

    try:
        trial = await kernel_ms(iters)
        scaled = max(1, round(iters * target_ms / trial))
        return {"iters": scaled, "kernel_ms": await kernel_ms(scaled), "trial_ms": trial}
    finally:
        for client in stack:
            await client.close()


def _run(coro: Any, loop: str) -> Any:
    if loop == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=("serve", "load", "direct", "calibrate"))
    p.add_argument("target", nargs="?", default="", help="the service, or the URL to load")
    p.add_argument("--workload", default="small", choices=("small", "compute"))
    p.add_argument("--iters", type=int, default=0, help="the compute kernel's iterations")
    p.add_argument("--loop", default="asyncio")
    p.add_argument("--device", default="host")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--tasks", type=int, default=64)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--runs", type=int, default=1, help="direct: windows one after the other")
    p.add_argument("--kernel-ms", type=float, default=1.0)
    p.add_argument("--gc-freeze", action="store_true")
    p.add_argument("--admit", type=int, default=0)
    p.add_argument("--echo", action="store_true", help="load: expect the body sent back")
    a = p.parse_args()
    work = workload(a.workload, a.iters)
    if a.what == "serve":
        _run(serve(a.target, a.device, a.gc_freeze, a.admit, work), a.loop)
    elif a.what == "direct":
        done = direct(a.target, work, a.device, a.tasks, a.warmup, a.seconds, a.runs)
        json.dump(_run(done, a.loop), sys.stdout)
    elif a.what == "calibrate":
        json.dump(_run(calibrate(a.device, a.iters, a.kernel_ms), a.loop), sys.stdout)
    else:
        bodies = work.inputs()
        check = Checker(work, bodies, echo=a.echo)
        print("READY", flush=True)
        start = float(sys.stdin.readline())
        json.dump(_run(load(a.target, a.clients, start, a.seconds, bodies, check), a.loop),
                  sys.stdout)  # fmt: skip


if __name__ == "__main__":
    main()
