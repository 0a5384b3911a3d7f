"""The processes of ``bench_service.py``: one service (``serve PEER``) or one load
generator (``load URL``). Run by bench_service.py, not by hand.

``serve PEER --loop L --device D`` prints ``PORT n`` once it listens on 127.0.0.1 (or
``SKIP reason`` and exits when PEER cannot run here), then serves ``POST /y`` and
``GET /stats?since=T0&until=T1`` (over that wall-clock window: the loop lag probe's
p99/max, and the garbage collector's pauses, which stop the loop too: milliseconds per
second, the longest, and the full collections; and since the start, the most requests
inside the handler at once). With ``--gc-freeze`` the server calls
``gc.freeze()`` once it is ready (what a service does to keep its start-up objects out
of every later collection). With ``--admit N`` at most N requests are inside the
handler at once; the others wait, their bodies unread (what a service does to bound the
work one loop iteration takes on).

``load URL --clients K --start T --seconds S`` runs K concurrent clients until
``T + S``, counts the requests completed inside ``[T, T + S]``, checks every response
against numpy (with ``--echo``: against the body sent) and prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

N_FLOATS = 64 * 1024  # 256 KiB of float32
PEERS = ("asynccube", "asynccube_lowlag", "cupy_thread", "torch_thread", "cupy_blocking",
         "numpy_loop", "echo")  # fmt: skip
OURS = {"asynccube": 1000, "asynccube_lowlag": 200}
"""asynccube's services and their ``streaming.batch_us`` (the default; a small budget)."""
Handler = Callable[[bytes], Awaitable[bytes]]

Y_SRC = r"""
extern "C" __global__ void y2x1(const float* x, float* y, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i] + 1.0f;
}
"""


def _host_y2x1(launch: Any) -> None:
    x = launch.buffers[0].view(np.float32)
    y = launch.buffers[1].view(np.float32)
    n = int(launch.scalar(np.uint32))
    np.multiply(x[:n], np.float32(2), out=y[:n])
    y[:n] += np.float32(1)


async def _asynccube(device: str, stack: list[Any], batch_us: int) -> tuple[Handler, str]:
    import asynccube as ac

    client = await ac.connect(device, config={"streaming": {"batch_us": batch_us}})
    stack.append(client)
    kernel = ac.Kernel(
        "bench_service_y2x1", cuda=ac.CudaSource(Y_SRC, "y2x1", (256, 1, 1)), host=_host_y2x1
    )
    count = ac.CubeCount((N_FLOATS + 255) // 256)
    nbytes = N_FLOATS * 4

    async def handle(body: bytes) -> bytes:
        x = client.create(body)
        y = client.empty(nbytes)
        bindings = (
            ac.Bindings()
            .with_buffers([x.binding(), y.binding()])
            .with_scalar(np.uint32, [N_FLOATS])
        )
        client.execute(kernel, count, bindings)
        (out,) = await client.read([y])
        return out

    await handle(bytes(nbytes))  # compile and load before the clock starts
    return handle, f"asynccube on {client.device}, batch_us {batch_us}"


def _cupy_fn() -> Callable[[bytes], bytes]:
    import cupy as cp

    cp.cuda.runtime.getDeviceCount()  # raises without a GPU

    def fn(body: bytes) -> bytes:
        x = cp.asarray(np.frombuffer(body, np.float32))
        y = 2 * x + 1
        out: bytes = y.get().tobytes()
        return out

    fn(bytes(N_FLOATS * 4))
    return fn


def _torch_fn() -> Callable[[bytes], bytes]:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False")

    def fn(body: bytes) -> bytes:
        x = torch.frombuffer(bytearray(body), dtype=torch.float32).to("cuda")
        y = x * 2 + 1
        out: bytes = y.cpu().numpy().tobytes()
        return out

    fn(bytes(N_FLOATS * 4))
    return fn


async def make_handler(peer: str, device: str, stack: list[Any]) -> tuple[Handler, str]:
    """The handler for ``peer``; raises with the reason when it cannot run here."""
    if peer in OURS:
        return await _asynccube(device, stack, OURS[peer])
    if peer == "numpy_loop":  # the floor: aiohttp and the bodies, no device at all

        async def on_loop(body: bytes) -> bytes:
            x = np.frombuffer(body, np.float32)
            return (x * np.float32(2) + np.float32(1)).tobytes()

        return on_loop, "numpy on the loop (no device)"
    if peer == "echo":  # the HTTP stack's own cost: the body back, no compute

        async def echo(body: bytes) -> bytes:
            return body

        return echo, "echo (no compute)"
    if device == "host":
        raise RuntimeError(f"{peer} needs a GPU; this run uses the host server")
    fn = _torch_fn() if peer == "torch_thread" else _cupy_fn()
    if peer == "cupy_blocking":

        async def blocking(body: bytes) -> bytes:
            return fn(body)

        return blocking, peer

    async def threaded(body: bytes) -> bytes:
        return await asyncio.to_thread(fn, body)

    return threaded, peer


async def _lag_probe(samples: list[tuple[float, float]]) -> None:
    while True:
        t0 = time.perf_counter()
        await asyncio.sleep(0.001)
        samples.append((time.time(), time.perf_counter() - t0 - 0.001))


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


async def serve(peer: str, device: str, freeze: bool = False, admit: int = 0) -> None:
    from aiohttp import web

    stack: list[Any] = []
    try:
        handle, info = await make_handler(peer, device, stack)
    except Exception as exc:
        print(f"SKIP {type(exc).__name__}: {exc}".replace("\n", " ")[:300], flush=True)
        return
    lags: list[tuple[float, float]] = []
    pauses: list[tuple[float, int, float]] = []
    probe = asyncio.create_task(_lag_probe(lags))
    gc.callbacks.append(_gc_probe(pauses))

    gate = asyncio.Semaphore(admit) if admit > 0 else None
    inside = [0, 0]  # requests in the handler now, and the most at once

    async def compute(request: web.Request) -> web.Response:
        inside[0] += 1
        inside[1] = max(inside[1], inside[0])
        try:
            return web.Response(body=await handle(await request.read()))
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
        probe.cancel()
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
    url: str, clients: int, start: float, seconds: float, echo: bool = False
) -> dict[str, Any]:
    import aiohttp

    rng = np.random.default_rng()
    inputs = [rng.standard_normal(N_FLOATS).astype(np.float32) for _ in range(8)]
    bodies = [(x.tobytes(), (x if echo else 2 * x + 1).tobytes()) for x in inputs]
    end = start + seconds
    out: dict[str, Any] = {"latencies_us": [], "checked": 0, "mismatches": 0, "errors": 0,
                           "first_error": ""}  # fmt: skip
    conn = aiohttp.TCPConnector(limit=clients)

    async def client(k: int, session: aiohttp.ClientSession) -> None:
        i = k
        while time.time() < end:
            body, want = bodies[i % len(bodies)]
            i += 1
            t0 = time.perf_counter()
            try:
                async with session.post(f"{url}/y", data=body) as resp:
                    got = await resp.read()
                    status = resp.status
            except Exception as exc:
                out["errors"] += 1
                out["first_error"] = out["first_error"] or repr(exc)[:200]
                continue
            t1 = time.perf_counter()
            done = time.time()
            out["checked"] += 1
            if status != 200 or got != want:
                out["mismatches"] += 1
                out["first_error"] = out["first_error"] or f"status {status}, {len(got)} bytes"
            elif start <= done <= end:
                out["latencies_us"].append(round((t1 - t0) * 1e6))

    async with aiohttp.ClientSession(connector=conn) as session:
        await asyncio.gather(*(client(k, session) for k in range(clients)))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=("serve", "load"))
    p.add_argument("target")
    p.add_argument("--loop", default="asyncio")
    p.add_argument("--device", default="host")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--start", type=float, default=0.0)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--gc-freeze", action="store_true")
    p.add_argument("--admit", type=int, default=0)
    p.add_argument("--echo", action="store_true", help="load: expect the body sent back")
    a = p.parse_args()
    coro: Any = (
        serve(a.target, a.device, a.gc_freeze, a.admit)
        if a.what == "serve"
        else load(a.target, a.clients, a.start, a.seconds, a.echo)
    )
    if a.loop == "uvloop":
        import uvloop

        result = uvloop.run(coro)
    else:
        result = asyncio.run(coro)
    if a.what == "load":
        json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
