"""``[memory] high_water_bytes`` (issue 39, point 5): a bound on what the pools keep
reserved, for services. One large request (two 96 MiB buffers, exclusive pages) leaves
192 MiB reserved in the default layout; with a 64 MiB mark, the empty pages above it are
given back once the released buffers are handled, on asyncio and trio; below the mark
pages are kept and reused; a bad value is refused."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import asynccube as ac
from asynccube._core.memory.config import MemoryConfig

pytestmark = pytest.mark.anyio
MiB = 1 << 20


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def host(
    request: pytest.FixtureRequest, anyio_backend: str
) -> AsyncIterator[ac.ComputeClient]:
    """A host client with ``high_water_bytes`` = the test's indirect parameter (0: none),
    opened outside the lag probe (a first client under trio takes milliseconds)."""
    config = {"memory": {"high_water_bytes": request.param}}
    async with ac.open_client("host", config=config) as client:
        yield client


async def _large_request(client: ac.ComputeClient) -> int:
    """Reserve two 96 MiB buffers (no data: nothing to copy on the loop), release them;
    the MiB reserved after."""
    x, y = client.empty(96 * MiB), client.empty(96 * MiB)
    await client.sync()  # both reserved, live at once
    del x, y
    await client.sync()
    return (await client.memory_usage()).bytes_reserved // MiB


@pytest.mark.parametrize("host", [0], indirect=True)
async def test_without_a_mark_the_pages_are_kept(host: ac.ComputeClient) -> None:
    assert await _large_request(host) == 192


@pytest.mark.parametrize("host", [64 * MiB], indirect=True)
async def test_a_mark_gives_back_the_pages_above_it(host: ac.ComputeClient) -> None:
    assert await _large_request(host) <= 64
    small = host.create(bytes(1024))  # small requests still served
    assert await host.read([small]) == [bytes(1024)]


@pytest.mark.parametrize("host", [512 * MiB], indirect=True)
async def test_below_the_mark_pages_are_kept_for_reuse(host: ac.ComputeClient) -> None:
    assert await _large_request(host) == 192
    assert await _large_request(host) == 192  # the same pages, reused


@pytest.mark.parametrize("host", [64 * MiB], indirect=True)
async def test_the_mark_survives_a_new_layout(host: ac.ComputeClient) -> None:
    await host.set_memory_layout(ac.MemoryLayout([ac.MemoryPool("exclusive", max_slice=256 * MiB)]))
    assert await _large_request(host) <= 64


async def test_a_bad_mark_is_refused(anyio_backend: str) -> None:
    with pytest.raises(ac.ConfigError, match="high_water_bytes"):  # refused before opening
        await ac.connect("host", config={"memory": {"high_water_bytes": -1}})


def test_the_memory_config_refuses_a_mark_of_zero() -> None:
    with pytest.raises(ValueError, match="high_water"):
        MemoryConfig(high_water=0)


@pytest.mark.cuda
async def test_a_mark_on_a_gpu(anyio_backend: str) -> None:
    config = {"memory": {"high_water_bytes": 64 * MiB}}
    async with ac.open_client("cuda:0", config=config) as client:
        assert await _large_request(client) <= 64
