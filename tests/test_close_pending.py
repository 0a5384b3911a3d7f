"""A shutdown that does not wait for abandoned work (issue 39, point 3), on asyncio and
trio: ``close(cancel_pending=True)`` drops the commands not yet issued to the server
(their awaitables raise ClientClosedError; those issued complete), and
``close(abandon_after=...)`` stops waiting for issued work that does not finish,
with a RuntimeWarning: its awaitables raise ClientClosedError, and the server frees its
memory once that work ends."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import pytest

import asynccube as ac

pytestmark = pytest.mark.anyio
QUEUED = 300
"""Reads sent in one loop step: past the 10 µs batch budget, all but the first few are
queued for the actor, not yet issued to the server."""


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def batched(anyio_backend: str) -> ac.ComputeClient:
    """A host client with the smallest batch budget, opened outside the lag probe (the
    test closes it)."""
    return await ac.connect("host", config={"streaming": {"batch_us": 10}})


@pytest.fixture
async def host(anyio_backend: str) -> Any:
    """A host client opened outside the lag probe, closed after the test."""
    client = await ac.connect("host")
    yield client
    await client.close()


async def _queued_reads(client: ac.ComputeClient) -> list[Any]:
    handle = client.create(b"data")
    return [client.read([handle]) for _ in range(QUEUED)]


async def _outcomes(futures: list[Any]) -> tuple[int, int]:
    """(answered, refused with ClientClosedError); anything else fails the test."""
    answered, refused = 0, []
    for fut in futures:
        try:
            assert await fut == [b"data"]
            answered += 1
        except ac.ClientClosedError as error:
            refused.append(str(error))
    assert all("cancel_pending" in message for message in refused)
    return answered, len(refused)


async def test_cancel_pending_drops_the_commands_not_yet_issued(
    batched: ac.ComputeClient,
) -> None:
    client = batched
    futures = await _queued_reads(client)
    await client.close(cancel_pending=True)
    answered, refused = await _outcomes(futures)
    assert answered + refused == QUEUED
    assert refused > QUEUED // 2  # most were queued, none ran
    with pytest.raises(ac.ClientClosedError):
        client.create(b"after")


async def test_without_cancel_pending_close_finishes_everything(
    batched: ac.ComputeClient,
) -> None:
    client = batched
    futures = await _queued_reads(client)
    await client.close()
    assert await _outcomes(futures) == (QUEUED, 0)


class Hold:
    """A host kernel that holds its stream until ``release`` is set."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        self.kernel = ac.Kernel(f"test_close_pending_hold_{id(self)}", host=self._hold)

    def _hold(self, launch: ac.HostLaunch) -> None:
        self.started.set()
        self.release.wait(30)  # the GIL is released while it waits

    async def running(self) -> None:
        """Until the kernel runs on its worker (issued: past a first use's prepare)."""
        deadline = time.monotonic() + 10
        while not self.started.is_set():
            assert time.monotonic() < deadline, "the held kernel never started"
            await anyio.sleep(0.005)


async def test_abandon_after_bounds_the_wait_for_issued_work(host: ac.ComputeClient) -> None:
    hold = Hold()
    client = host
    server = client._channel.server
    try:
        handle = client.create(bytes(1 << 20))
        client.execute(hold.kernel, ac.CubeCount(1), ac.Bindings())
        await hold.running()
        behind = client.read([handle])  # issued, behind the held kernel
        start = time.monotonic()
        with pytest.warns(RuntimeWarning, match=r"abandon_after=0.2.*abandoned \(1 awaitable"):
            await client.close(cancel_pending=True, abandon_after=0.2)
        took = time.monotonic() - start
        with pytest.raises(ac.ClientClosedError, match="abandoned at close"):
            await behind
        assert 0.15 <= took < 10
        assert server._memory.memory_usage().bytes_reserved > 0  # the work still runs
    finally:
        hold.release.set()
    deadline = time.monotonic() + 10
    while not server._memory.closed:  # the server's own close ends with the work
        assert time.monotonic() < deadline, "the server's memory was never freed"
        await anyio.sleep(0.01)
    assert server._memory.memory_usage().bytes_reserved == 0
    await client.close()  # closing again: nothing more


async def test_abandon_after_is_not_used_when_the_work_ends_in_time(
    host: ac.ComputeClient,
) -> None:
    client = host
    read = client.read([client.create(b"quick")])
    await client.close(abandon_after=30)  # no warning (warnings are errors here)
    assert await read == [b"quick"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"cancel_pending": 1}, "cancel_pending=.... must be True or False"),
        ({"abandon_after": -1}, "abandon_after=.... must be a number of seconds >= 0"),
        ({"abandon_after": "5"}, "abandon_after"),
        ({"abandon_after": float("nan")}, "abandon_after"),
        ({"abandon_after": True}, "abandon_after"),
    ],
)
async def test_bad_close_arguments_are_refused_and_the_client_keeps_serving(
    host: ac.ComputeClient, kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ac.InvalidArgument, match=match):
        await host.close(**kwargs)
    assert await host.read([host.create(b"still")]) == [b"still"]


@pytest.mark.cuda
@pytest.mark.allow_loop_lag  # the test's own step sends QUEUED reads at once
async def test_cancel_pending_on_a_gpu(anyio_backend: str) -> None:
    client = await ac.connect("cuda:0", config={"streaming": {"batch_us": 10}})
    futures = await _queued_reads(client)
    await client.close(cancel_pending=True)
    answered, refused = await _outcomes(futures)
    assert answered + refused == QUEUED and refused > 0
