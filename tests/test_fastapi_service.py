"""examples/fastapi_service.py (issue 39) on the host server: FastAPI and plain Starlette
through httpx's ASGI transport (good answers, bad input refused with a 4xx and one line
of JSON, 10,000 bad requests mixed with good ones, a stalled body, clients that
disconnect while their body arrives or while their work runs), and under uvicorn with
two worker processes, one client each, stopped by SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import numpy.random  # imported lazily otherwise, inside a test step
import pytest
import pytest_asyncio

import asynccube as ac

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from .service_helpers import EXAMPLES, OCTETS, chunks, load_example, values, y  # noqa: E402

fs = load_example("fastapi_service")
FRAMEWORKS = {"fastapi": fs.create_app, "starlette": fs.create_starlette_app}


@pytest_asyncio.fixture
async def served(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Any, Any]]:
    """The example's app of ``(framework, limits, compute)`` (the test's indirect
    parameter) on the host server, its lifespan run, behind an httpx client on the ASGI
    transport; warmed by 16 concurrent requests, then its counts reset. Yields the httpx
    client and the app's ``Service``."""
    framework, limits, compute = request.param
    app = FRAMEWORKS[framework]("host", limits, compute or fs.y2x1)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://asgi") as http:
            x = values(3, 256)
            answers = await asyncio.gather(*(post(http, x.tobytes(), OCTETS) for _ in range(16)))
            assert answers == [(200, y(x))] * 16
            service = app.state.service
            service.counts = fs.Counts()
            yield http, service


async def post(http: Any, data: Any, headers: dict[str, str]) -> tuple[int, bytes]:
    resp = await http.post("/y", content=data, headers=headers)
    return resp.status_code, resp.content


def one_line_error(body: bytes) -> str:
    """The error's message; the body is one line of JSON ``{"error": ...}``."""
    assert b"\n" not in body.rstrip(b"\n"), body
    (key, message), *rest = json.loads(body).items()
    assert key == "error" and not rest, body
    return str(message)


LIMIT = 8 << 10
BAD: list[tuple[str, Callable[[], Any], dict[str, str], int, str]] = [
    ("wrong content type", lambda: bytes(64), {"Content-Type": "text/plain"}, 415,
     "Content-Type must be application/octet-stream, got 'text/plain'"),
    ("no content type", lambda: bytes(64), {}, 415,
     "Content-Type must be application/octet-stream, got ''"),
    ("length not a multiple of 4", lambda: bytes(63), OCTETS, 400,
     "the body has 63 bytes, not a multiple of 4 (float32)"),
    ("five bytes", lambda: bytes(5), OCTETS, 400,
     "the body has 5 bytes, not a multiple of 4 (float32)"),
    ("empty body", lambda: b"", OCTETS, 400, "the body is empty: send float32 values"),
    ("over the limit", lambda: bytes(LIMIT + 4), OCTETS, 413,
     f"the body has {LIMIT + 4} bytes, over the limit of {LIMIT}"),
    ("chunked, not a multiple of 4", lambda: chunks(bytes(32), bytes(5)), OCTETS, 400,
     "the body has 37 bytes, not a multiple of 4 (float32)"),
    ("chunked, over the limit", lambda: chunks(bytes(LIMIT), bytes(8)), OCTETS, 413,
     f"the body is over the limit of {LIMIT} bytes"),
]  # fmt: skip
"""Each kind of bad request: its name, body, headers, status and error message."""
BOTH = [(framework, fs.Limits(max_bytes=LIMIT), None) for framework in FRAMEWORKS]


@pytest.mark.asyncio
@pytest.mark.parametrize("served", BOTH, indirect=True, ids=list(FRAMEWORKS))
async def test_good_requests_are_answered_and_bad_ones_refused_with_one_line_of_json(
    served: tuple[Any, Any],
) -> None:
    http, service = served
    x = values(0, LIMIT // 4)  # exactly the limit
    assert await post(http, x.tobytes(), OCTETS) == (200, y(x))
    for name, body, headers, status, message in BAD:
        got, text = await post(http, body(), headers)
        assert (got, one_line_error(text)) == (status, message), name
    health = (await http.get("/health")).json()
    loop = health.pop("loop")
    assert health == {"status": "ok", "device": "host", "pid": os.getpid(), "served": 1,
                      "cancelled": 0, "in_flight": 0,
                      "refused": {"415": 2, "400": 4, "413": 2}}  # fmt: skip
    assert {"lag_p50_ms", "lag_p99_ms", "lag_max_ms", "worst_step_culprit"} <= set(loop)
    assert service.monitor.running


@pytest.mark.asyncio
@pytest.mark.parametrize("served", BOTH[:1], indirect=True, ids=["fastapi"])
async def test_the_typed_dependency_gives_the_client(served: tuple[Any, Any]) -> None:
    http, service = served
    assert (await http.get("/device")).json() == {"device": service.client.device}


@pytest.mark.asyncio
@pytest.mark.slow
# ~11,000 requests through httpx, Starlette and the service in one loop, for ~10 s: on a
# loaded 2-core machine one step preempted past 5 ms is likely, and the probe cannot tell
# that from a blocked loop. The service's own steps are probed by the other tests.
@pytest.mark.allow_loop_lag
@pytest.mark.parametrize("served", BOTH[:1], indirect=True, ids=["fastapi"])
async def test_ten_thousand_bad_requests_mixed_with_good_ones(served: tuple[Any, Any]) -> None:
    good, bad, workers = 1000, 10_000, 32
    inputs = [values(i, 256 * (1 + i % 4)) for i in range(16)]
    http, service = served
    before = await service.client.memory_usage()
    statuses: Counter[int] = Counter()
    wrong: list[str] = []
    kinds = iter(range(good + bad))

    async def worker() -> None:
        for k in kinds:  # shared: each request is taken by one worker
            if k % 11 == 0:  # 1 in 11 good: 1000 of 11,000
                x = inputs[k % len(inputs)]
                status, body = await post(http, x.tobytes(), OCTETS)
                statuses[status] += 1
                if (status, body) != (200, y(x)):
                    wrong.append(f"good request {k}: {status} {body[:100]!r}")
                continue
            name, make, headers, want, message = BAD[k % len(BAD)]
            status, body = await post(http, make(), headers)
            statuses[status] += 1
            if status != want or one_line_error(body) != message:
                wrong.append(f"{name} ({k}): {status} {body[:100]!r}")

    await asyncio.gather(*(worker() for _ in range(workers)))
    await service.client.sync()
    after = await service.client.memory_usage()
    counts = service.counts
    assert wrong == []
    assert sum(statuses.values()) == good + bad
    assert statuses[200] == good
    assert not [s for s in statuses if s >= 500]
    assert counts.served == good and sum(counts.refused.values()) == bad
    assert counts.in_flight == 0 and counts.cancelled == 0
    assert after.bytes_in_use == before.bytes_in_use


class Asgi:
    """One request driven by hand through the ASGI interface: its body in ``parts``,
    then the client's ``disconnect`` (an event the test sets), or nothing more
    (``stall``: the rest of the body never comes)."""

    def __init__(self, parts: list[bytes], *, length: int | None, stall: bool = False) -> None:
        self.parts, self.stall = list(parts), stall
        self.disconnect = asyncio.Event()
        self.sent: list[dict[str, Any]] = []
        headers = [(b"content-type", b"application/octet-stream")]
        if length is not None:
            headers.append((b"content-length", str(length).encode()))
        self.scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                      "method": "POST", "scheme": "http", "path": "/y", "raw_path": b"/y",
                      "query_string": b"", "root_path": "", "headers": headers,
                      "client": ("127.0.0.1", 1), "server": ("asgi", 80)}  # fmt: skip

    async def receive(self) -> dict[str, Any]:
        if self.parts:
            part = self.parts.pop(0)
            more = bool(self.parts) or self.stall
            return {"type": "http.request", "body": part, "more_body": more}
        if self.stall:
            await asyncio.Event().wait()  # never: the body stalls
        await self.disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    def status(self) -> int:
        return int(next(m["status"] for m in self.sent if m["type"] == "http.response.start"))


class Held:
    """A compute that holds its request's stream (a host kernel waiting on ``release``)
    before ``2x + 1``, and sets ``started`` once its work is queued."""

    def __init__(self) -> None:
        self.started, self.release = asyncio.Event(), threading.Event()
        self.kernel = ac.Kernel(f"test_fastapi_service_hold_{id(self)}", host=self._hold)

    def _hold(self, launch: ac.HostLaunch) -> None:
        self.release.wait(30)  # the GIL is released while it waits

    async def __call__(self, client: ac.ComputeClient, body: bytes) -> bytes:
        if body.startswith(np.float32(-1).tobytes()):
            client.execute(self.kernel, ac.CubeCount(1), ac.Bindings())
            self.started.set()
        out: bytes = await fs.y2x1(client, body)
        return out


@pytest.mark.asyncio
@pytest.mark.parametrize("framework", list(FRAMEWORKS))
async def test_a_client_that_disconnects_cancels_its_work_and_leaks_nothing(
    framework: str,
) -> None:
    held = Held()
    app = FRAMEWORKS[framework]("host", fs.Limits(), held)
    body = np.full(1 << 14, -1, np.float32).tobytes()
    async with app.router.lifespan_context(app):
        service = app.state.service
        client = service.client
        await client.sync()
        before = await client.memory_usage()
        try:
            # While its work runs: the awaited read is cancelled.
            running = Asgi([body], length=len(body))
            call = asyncio.create_task(app(running.scope, running.receive, running.send))
            await asyncio.wait_for(held.started.wait(), 10)
            assert (await client.memory_usage()).bytes_in_use > before.bytes_in_use
            running.disconnect.set()
            await asyncio.wait_for(call, 10)
            # While its body arrives.
            arriving = Asgi([body[:1000]], length=len(body))
            arriving.disconnect.set()
            await asyncio.wait_for(app(arriving.scope, arriving.receive, arriving.send), 10)
        finally:
            held.release.set()
        await client.sync()
        after = await client.memory_usage()
        counts = service.counts
    assert (running.status(), arriving.status()) == (499, 499)
    assert (counts.cancelled, counts.served, counts.in_flight, counts.refused) == (2, 0, 0, {})
    assert after.bytes_in_use == before.bytes_in_use


@pytest.mark.asyncio
@pytest.mark.parametrize("framework", list(FRAMEWORKS))
async def test_shutdown_abandons_work_that_does_not_finish_in_time(framework: str) -> None:
    held = Held()
    app = FRAMEWORKS[framework]("host", fs.Limits(shutdown_after=0.2), held)
    body = np.full(1024, -1, np.float32).tobytes()
    lifespan = app.router.lifespan_context(app)
    await lifespan.__aenter__()
    try:
        running = Asgi([body], length=len(body))
        call = asyncio.create_task(app(running.scope, running.receive, running.send))
        await asyncio.wait_for(held.started.wait(), 10)
        start = time.monotonic()
        with pytest.warns(RuntimeWarning, match="abandoned"):
            await lifespan.__aexit__(None, None, None)  # SIGTERM: uvicorn ends the lifespan
        took = time.monotonic() - start
        await asyncio.wait_for(call, 10)
    finally:
        held.release.set()
    assert running.status() == 503
    assert took < 5  # not the 30 s the held kernel would take


@pytest.mark.asyncio
@pytest.mark.parametrize("framework", list(FRAMEWORKS))
async def test_a_stalled_body_gets_408_in_time(framework: str) -> None:
    timeout = 0.3
    app = FRAMEWORKS[framework]("host", fs.Limits(body_timeout=timeout), fs.y2x1)
    async with app.router.lifespan_context(app):
        stalled = Asgi([bytes(2048)], length=4096, stall=True)
        start = time.monotonic()
        await asyncio.wait_for(app(stalled.scope, stalled.receive, stalled.send), 10)
        took = time.monotonic() - start
        counts = app.state.service.counts
    body = b"".join(m.get("body", b"") for m in stalled.sent if m["type"] == "http.response.body")
    assert stalled.status() == 408
    assert one_line_error(body) == f"the body did not arrive within {timeout:g} s"
    assert timeout * 0.9 <= took <= timeout + 5
    assert counts.refused == {408: 1}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_under_uvicorn_two_workers_each_with_its_client_stop_on_sigterm() -> None:
    pytest.importorskip("uvicorn")
    port = _free_port()
    env = {**os.environ, "GPU_SERVICE_DEVICE": "host", "GPU_SERVICE_MAX_BYTES": str(LIMIT)}
    command = [sys.executable, "-m", "uvicorn", "--app-dir", str(EXAMPLES),
               "fastapi_service:app", "--host", "127.0.0.1", "--port", str(port),
               "--workers", "2", "--timeout-graceful-shutdown", "5"]  # fmt: skip
    server = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=10) as http:
            deadline = time.monotonic() + 60
            while True:
                assert server.poll() is None, server.stderr.read() if server.stderr else ""
                assert time.monotonic() < deadline, "uvicorn did not start within 60 s"
                try:
                    if http.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            for i in range(50):
                x = values(i, 64 * (1 + i % 4))
                resp = http.post("/y", content=x.tobytes(), headers=OCTETS)
                assert (resp.status_code, resp.content) == (200, y(x))
                _, make, headers, status, message = BAD[i % 6]  # the unchunked ones
                resp = http.post("/y", content=make(), headers=headers)
                assert (resp.status_code, one_line_error(resp.content)) == (status, message)
        server.send_signal(signal.SIGTERM)
        _, log = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    opened = [line for line in log.splitlines() if "client open on host" in line]
    closed = [line for line in log.splitlines() if "client closed" in line]
    pids = {line.split("worker ")[1].split(":")[0] for line in opened}
    assert len(opened) == 2 and len(pids) == 2, log  # one client per worker process
    assert len(closed) == 2, log
    assert server.returncode == 0, log
