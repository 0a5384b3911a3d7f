"""The server process of ``bench_fastapi.py``: the example FastAPI service
(``examples/fastapi_service.py``) under uvicorn, with one of four computations behind its
``POST /y``. Run by bench_fastapi.py, not by hand.

``serve PEER --loop L --device D --window S --http H`` prints ``PORT n`` once uvicorn
listens on 127.0.0.1 and the app's lifespan has run (or ``SKIP reason`` and exits), then
serves until SIGTERM (uvicorn's own shutdown: the lifespan closes the client). PEER:

* ``asynccube``: the example's FastAPI app as users run it (``create_app``);
* ``starlette``: the same service on plain Starlette (``create_starlette_app``);
* ``numpy_loop``: the same FastAPI app, ``2x + 1`` computed in numpy on the loop;
* ``echo``: the same FastAPI app answering the body itself: the HTTP stack's own cost
  (uvicorn, FastAPI, the example's checks of each body).

The floors' client (opened by the lifespan, never used by a request) is on the host
server. Every app keeps the example's ``LoopMonitor`` defaults (a 10 ms ticker, steps
timed one tick in ten) with its ``window`` set to S seconds and a report taken every
0.1 s; ``GET /stats?since=T0&until=T1`` answers the first report taken at or after T1
(so covering about ``[T1 - S, T1]``), the monitor's snapshot as the example's
``/health`` gives it (``LoopLagReport.as_dict``), with the example's request counts.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from _service_app import _run
from _service_work import make_handler, workload

PEERS = ("asynccube", "starlette", "numpy_loop", "echo")
REPORT_EVERY = 0.1
"""Seconds between two of the monitor's reports (the window's alignment)."""


async def make_app(peer: str, device: str, stack: list[Any]) -> tuple[Any, str]:
    """The example's app for ``peer`` (see the module docstring) and its framework's
    name; raises saying why it cannot run here. A floor's handler client is appended to
    ``stack`` (closed by the caller)."""
    import fastapi_service as fs

    limits = fs.Limits(max_bytes=4 << 20)
    if peer == "asynccube":
        return fs.create_app(device, limits), "FastAPI"
    if peer == "starlette":
        return fs.create_starlette_app(device, limits), "Starlette"
    if peer not in PEERS:
        raise RuntimeError(f"unknown service {peer!r}; one of {', '.join(PEERS)}")
    handle, _ = await make_handler(peer, workload("small"), "host", stack)

    async def compute(client: Any, body: bytes) -> bytes:
        return await handle(body)

    return fs.create_app("host", limits, compute), "FastAPI"


def add_stats(app: Any, window: float) -> None:
    """Replace the app's monitor by one of ``window`` seconds reporting every
    :data:`REPORT_EVERY`, and add ``GET /stats`` (see the module docstring)."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    import asynccube as ac

    service = app.state.service
    reports: list[tuple[float, dict[str, Any]]] = []

    def keep(report: ac.LoopLagReport) -> None:
        reports.append((time.time(), report.as_dict()))

    service.monitor = ac.LoopMonitor(window=window, report_every=REPORT_EVERY, on_report=keep)

    async def stats(request: Request) -> JSONResponse:
        until = float(request.query_params["until"])
        loop = next((r for t, r in reports if t >= until), None)
        loop = loop or service.monitor.snapshot().as_dict()
        c = service.counts
        return JSONResponse({"loop": loop, "served": c.served, "refused": c.refused,
                             "cancelled": c.cancelled, "info": app.state.info})  # fmt: skip

    app.router.routes.append(Route("/stats", stats))


async def serve(peer: str, device: str, window: float, http: str) -> None:
    """Serve ``peer`` under uvicorn until SIGTERM (see the module docstring)."""
    import uvicorn

    stack: list[Any] = []
    try:
        app, framework = await make_app(peer, device, stack)
        add_stats(app, window)
        config = uvicorn.Config(app, http=http, lifespan="on", log_level="warning",
                                access_log=False, backlog=1024)  # fmt: skip
        config.load()
    except Exception as exc:
        print(f"SKIP {type(exc).__name__}: {exc}".replace("\n", " ")[:300], flush=True)
        return
    protocol = config.http_protocol_class.__name__.removesuffix("Protocol").lower()
    where = "no device" if peer in ("numpy_loop", "echo") else device
    app.state.info = f"{peer}, {framework} on uvicorn {uvicorn.__version__} ({protocol}), {where}"
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # the lifespan has opened the client and compiled the kernel
        if task.done():
            print(f"SKIP the server stopped before serving: {task.exception()!r}"[:300], flush=True)
            return
        await asyncio.sleep(0.01)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    try:
        await task
    finally:
        for client in stack:
            await client.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=("serve",))
    p.add_argument("peer", choices=PEERS)
    p.add_argument("--loop", default="asyncio", choices=("asyncio", "uvloop"))
    p.add_argument("--device", default="host")
    p.add_argument("--window", type=float, default=3.0, help="the monitor's window (s)")
    p.add_argument("--http", default="auto", choices=("auto", "h11", "httptools"))
    a = p.parse_args()
    _run(serve(a.peer, a.device, a.window, a.http), a.loop)


if __name__ == "__main__":
    main()
