"""What host streams share (issue 39, point 2), on asyncio and trio: the host server runs
each stream slot (stream id mod its ``max_streams``, at most one per core) on one worker
thread, in submission order, so a slow kernel holds every stream of its slot; streams
of other slots, and other clients, go on. The streams guide says so, with the two ways
to keep fast work clear of slow work that these tests check."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator

import anyio
import pytest

import asynccube as ac

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Slow:
    """A host kernel that holds its worker until ``release`` (a slow kernel)."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        self.kernel = ac.Kernel(f"test_host_stream_sharing_slow_{id(self)}", host=self._run)

    def _run(self, launch: ac.HostLaunch) -> None:
        self.started.set()
        self.release.wait(30)

    async def launch(self, client: ac.ComputeClient, stream: int) -> None:
        with ac.StreamId.pinned(stream):
            client.execute(self.kernel, ac.CubeCount(1), ac.Bindings())
        deadline = time.monotonic() + 10
        while not self.started.is_set():
            assert time.monotonic() < deadline, "the slow kernel never started"
            await anyio.sleep(0.005)


@pytest.fixture
async def host(anyio_backend: str) -> AsyncIterator[ac.ComputeClient]:
    client = await ac.connect("host")
    yield client
    await client.close()


@pytest.fixture
async def other(anyio_backend: str) -> AsyncIterator[ac.ComputeClient]:
    client = await ac.connect("host")
    yield client
    await client.close()


def slots(client: ac.ComputeClient) -> int:
    return int(client._channel.server._streams.max_streams)


async def fast_read(client: ac.ComputeClient, stream: int, within: float) -> bool:
    """Whether a 1 KiB round trip on ``stream`` completes within ``within`` seconds."""
    with ac.StreamId.pinned(stream):
        read = client.read([client.create(bytes(1024))])
    with anyio.move_on_after(within):
        assert await read == [bytes(1024)]
        return True
    read.cancel()
    return False


async def test_a_slow_kernel_holds_the_streams_of_its_slot(host: ac.ComputeClient) -> None:
    slow = Slow()
    try:
        await slow.launch(host, stream=0)
        assert not await fast_read(host, stream=slots(host), within=0.3)  # same slot: waits
    finally:
        slow.release.set()
    assert await fast_read(host, stream=slots(host), within=10)


async def test_streams_of_other_slots_go_on(host: ac.ComputeClient) -> None:
    slow = Slow()
    try:
        await slow.launch(host, stream=0)
        for stream in range(1, slots(host)):
            assert await fast_read(host, stream=stream, within=10)
        assert not slow.release.is_set()  # all of them while the slow kernel ran
    finally:
        slow.release.set()


async def test_another_client_goes_on(host: ac.ComputeClient, other: ac.ComputeClient) -> None:
    slow = Slow()
    try:
        await slow.launch(host, stream=0)
        for stream in range(2 * slots(other)):  # every slot of its own workers
            assert await fast_read(other, stream=stream, within=10)
        assert not slow.release.is_set()
    finally:
        slow.release.set()
