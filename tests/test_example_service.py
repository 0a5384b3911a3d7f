"""examples/gpu_service.py on the host server, on a real loopback server (issue 30): good
answers, bad input refused with a 4xx and one line of JSON, 10,000 bad requests mixed
with good ones, a stalled half body, and clients that disconnect mid-request."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import numpy.random  # imported lazily otherwise, inside a test step
import pytest
import pytest_asyncio

import asynccube as ac

aiohttp = pytest.importorskip("aiohttp")
from aiohttp import web  # noqa: E402

from .service_helpers import OCTETS, chunks, load_example, values, y  # noqa: E402

gs = load_example("gpu_service")


@asynccontextmanager
async def serving(
    limits: Any, compute: Any = None, device: str = "host"
) -> AsyncIterator[tuple[str, Any]]:
    """The example's app on 127.0.0.1 (an ephemeral port), on ``device``: its URL and its
    ``Service``."""
    app = gs.create_app(device, limits, compute or gs.y2x1)
    runner = web.AppRunner(app, access_log=None, **gs.runner_options(limits))
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", app[gs.SERVICE]
    finally:
        await runner.cleanup()


@pytest_asyncio.fixture
async def served(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, Any]]:
    """:func:`serving` of ``(limits, compute[, device])`` (the test's indirect parameter), warmed
    by 16 concurrent requests, then its counts reset. A fixture, so its start is outside
    the lag probe (which times the test's body): the first client a process opens, and
    the host server's first use of each stream (it starts the stream's worker thread),
    take milliseconds of loop time on a loaded machine."""
    async with serving(*request.param) as (url, service):
        async with aiohttp.ClientSession() as session:
            x = values(3, 256)
            answers = await asyncio.gather(*(post(session, url, x.tobytes(), OCTETS)
                                             for _ in range(16)))  # fmt: skip
        assert answers == [(200, y(x))] * 16
        service.counts = gs.Counts()
        yield url, service


async def post(session: Any, url: str, data: Any, headers: dict[str, str]) -> tuple[int, bytes]:
    async with session.post(f"{url}/y", data=data, headers=headers) as resp:
        return resp.status, await resp.read()


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
    ("length not a multiple of 4", lambda: bytes(63), OCTETS, 400,
     "the body has 63 bytes, not a multiple of 4 (float32)"),
    ("empty body", lambda: b"", OCTETS, 400, "the body is empty: send float32 values"),
    ("over the limit", lambda: bytes(LIMIT + 4), OCTETS, 413,
     f"the body has {LIMIT + 4} bytes, over the limit of {LIMIT}"),
    ("chunked, not a multiple of 4", lambda: chunks(bytes(32), bytes(5)), OCTETS, 400,
     "the body has 37 bytes, not a multiple of 4 (float32)"),
    ("chunked, over the limit", lambda: chunks(bytes(LIMIT), bytes(8)), OCTETS, 413,
     f"the body is over the limit of {LIMIT} bytes"),
]  # fmt: skip
"""Each kind of bad request: its name, body, headers, status and error message."""


@pytest.mark.asyncio
@pytest.mark.parametrize("served", [(gs.Limits(max_bytes=LIMIT), None)], indirect=True)
async def test_good_requests_are_answered_and_bad_ones_refused_with_one_line_of_json(
    served: tuple[str, Any],
) -> None:
    url, _ = served
    async with aiohttp.ClientSession() as s:
        x = values(0, LIMIT // 4)  # exactly the limit
        assert await post(s, url, x.tobytes(), OCTETS) == (200, y(x))
        for name, body, headers, status, message in BAD:
            got, text = await post(s, url, body(), headers)
            assert (got, one_line_error(text)) == (status, message), name
        async with s.get(f"{url}/health") as resp:
            health = await resp.json()
    assert health == {"status": "ok", "device": "host", "served": 1, "cancelled": 0,
                      "in_flight": 0, "refused": {"415": 1, "400": 3, "413": 2}}  # fmt: skip


@pytest.mark.asyncio
@pytest.mark.slow
# ~100,000 loop steps of the client and the server in one loop, for ~5 s: on a loaded
# 2-core machine, one of them preempted by another process past 5 ms is likely, and the
# probe cannot tell that from a blocked loop. The service's own steps are probed by the
# other tests of this file.
@pytest.mark.allow_loop_lag
@pytest.mark.parametrize("served", [(gs.Limits(max_bytes=LIMIT), None)], indirect=True)
async def test_ten_thousand_bad_requests_mixed_with_good_ones(served: tuple[str, Any]) -> None:
    good, bad, workers = 1000, 10_000, 32
    inputs = [values(i, 256 * (1 + i % 4)) for i in range(16)]
    url, service = served
    before = await service.client.memory_usage()
    statuses: Counter[int] = Counter()
    wrong: list[str] = []
    kinds = iter(range(good + bad))

    async def worker(session: Any) -> None:
        for k in kinds:  # shared: each request is taken by one worker
            if k % 11 == 0:  # 1 in 11 good: 1000 of 11,000
                x = inputs[k % len(inputs)]
                status, body = await post(session, url, x.tobytes(), OCTETS)
                statuses[status] += 1
                if (status, body) != (200, y(x)):
                    wrong.append(f"good request {k}: {status} {body[:100]!r}")
                continue
            name, make, headers, want, message = BAD[k % len(BAD)]
            status, body = await post(session, url, make(), headers)
            statuses[status] += 1
            if status != want or one_line_error(body) != message:
                wrong.append(f"{name} ({k}): {status} {body[:100]!r}")

    connector = aiohttp.TCPConnector(limit=workers)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(worker(session) for _ in range(workers)))
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


@pytest.mark.asyncio
@pytest.mark.cuda
@pytest.mark.parametrize("served", [(gs.Limits(max_bytes=LIMIT), None, "cuda:0")], indirect=True)
async def test_on_a_gpu_good_answers_refusals_and_memory_back(served: tuple[str, Any]) -> None:
    url, service = served
    client = service.client
    before = await client.memory_usage()
    inputs = [values(i, n) for i, n in enumerate((1, 255, 256, 257, LIMIT // 4))]
    async with aiohttp.ClientSession() as s:
        answers = await asyncio.gather(*(post(s, url, x.tobytes(), OCTETS) for x in inputs))
        assert answers == [(200, y(x)) for x in inputs]
        for name, body, headers, status, message in BAD:
            got, text = await post(s, url, body(), headers)
            assert (got, one_line_error(text)) == (status, message), name
    await client.sync()
    assert client.device == "cuda:0"
    assert (await client.memory_usage()).bytes_in_use == before.bytes_in_use


def _head(content_length: int | None) -> bytes:
    framing = (f"Content-Length: {content_length}" if content_length is not None
               else "Transfer-Encoding: chunked")  # fmt: skip
    return (f"POST /y HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n"
            f"{framing}\r\n\r\n").encode()  # fmt: skip


HALF_BODIES = {
    "content-length": _head(4096) + bytes(2048),
    "chunked": _head(None) + b"1000\r\n" + bytes(2048),  # a chunk of 4096 announced
}


STALL_S = 0.5


@pytest.mark.asyncio
@pytest.mark.parametrize("served", [(gs.Limits(body_timeout=STALL_S), None)], indirect=True)
@pytest.mark.parametrize("framing", sorted(HALF_BODIES))
async def test_a_stalled_half_body_gets_408_in_time_and_the_others_are_served(
    framing: str, served: tuple[str, Any]
) -> None:
    timeout, (url, service) = STALL_S, served
    reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
    try:
        writer.write(HALF_BODIES[framing])
        await writer.drain()
        sent = time.monotonic()
        async with aiohttp.ClientSession() as session:  # served while the other stalls
            x = values(1, 1024)
            assert await post(session, url, x.tobytes(), OCTETS) == (200, y(x))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout + 5)
        took = time.monotonic() - sent
        rest = await asyncio.wait_for(reader.read(), timeout + 5)  # then it closes
    finally:
        writer.close()
        await writer.wait_closed()
    counts = service.counts
    assert head.startswith(b"HTTP/1.1 408 "), head
    assert b"Connection: close" in head
    assert timeout * 0.9 <= took <= timeout + 4
    assert one_line_error(rest) == f"the body did not arrive within {timeout:g} s"
    assert counts.refused == {408: 1} and counts.served == 1


class Held:
    """A compute that holds its request's stream (a host kernel waiting on ``release``)
    before ``2x + 1`` when the body's first value is -1, and sets ``started`` once that
    request's work is queued."""

    def __init__(self) -> None:
        self.started, self.release = asyncio.Event(), threading.Event()
        self.kernel = ac.Kernel(f"test_example_service_hold_{id(self)}", host=self._hold)

    def _hold(self, launch: ac.HostLaunch) -> None:
        self.release.wait(30)  # the GIL is released while it waits

    async def __call__(self, client: ac.ComputeClient, body: bytes) -> bytes:
        if body.startswith(np.float32(-1).tobytes()):
            client.execute(self.kernel, ac.CubeCount(1), ac.Bindings())
            self.started.set()
        out: bytes = await gs.y2x1(client, body)
        return out


HELD = Held()


@pytest.mark.asyncio
@pytest.mark.parametrize("served", [(gs.Limits(), HELD)], indirect=True)
async def test_a_client_that_disconnects_mid_request_cancels_it_and_leaks_nothing(
    served: tuple[str, Any],
) -> None:
    url, service = served
    client, port = service.client, int(url.rsplit(":", 1)[1])
    before = await client.memory_usage()
    body = np.full(1 << 16, -1, np.float32).tobytes()
    try:
        for request in (_head(len(body)) + body[:1000], _head(len(body)) + body):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            await writer.drain()
            if request.endswith(body):  # queued on the device, its read awaited
                await asyncio.wait_for(HELD.started.wait(), 10)
                assert (await client.memory_usage()).bytes_in_use > before.bytes_in_use
            else:  # waiting for the rest of its body
                await _until(lambda: service.counts.in_flight == 1)
            writer.transport.abort()
            await _until(lambda: service.counts.in_flight == 0)
    finally:
        HELD.release.set()
    await client.sync()
    after = await client.memory_usage()
    async with aiohttp.ClientSession() as session:  # and it goes on serving
        x = values(2, 1024)
        assert await post(session, url, x.tobytes(), OCTETS) == (200, y(x))
    counts = service.counts
    assert (counts.cancelled, counts.served, counts.refused) == (2, 1, {})
    assert after.bytes_in_use == before.bytes_in_use


async def _until(condition: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_the_documented_command_lines_parse() -> None:
    lines = [line.strip() for line in (gs.__doc__ or "").splitlines()]
    commands = [line.split("#")[0].split()[2:] for line in lines if line.startswith("python ex")]
    assert len(commands) == 2
    for argv in commands:
        args = gs.parse_args(argv)
        gs.Limits(args.max_bytes, args.body_timeout)
    with pytest.raises(ValueError, match="max_bytes must be in"):
        gs.Limits(max_bytes=0)
