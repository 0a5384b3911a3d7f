"""CHECKED launches are validated against the same limits on every server: the device's
on CUDA, CUDA's documented ones on the host (issue 10, finding 5)."""

from __future__ import annotations

import numpy as np
import pytest

import asynccube as ac
from asynccube._core.server.launch_limits import HOST_LIMITS, grid_problem

from .kernels import ADD, NOOP, add_bindings

pytestmark = pytest.mark.anyio  # each backend: asyncio and trio

_BIG_BLOCK_CUDA = r"""
extern "C" __global__ void big(float* x) { x[threadIdx.x] = 0.0f; }
"""
BIG_BLOCK = ac.Kernel(
    "test_big_block",
    cuda=ac.CudaSource(_BIG_BLOCK_CUDA, entry="big", block=(1024, 2, 1)),
    host=lambda launch: None,
)
"""2048 threads per block: more than any GPU allows."""


def _small_add(client: ac.ComputeClient) -> ac.Bindings:
    h = client.create(np.zeros(4, np.float32))
    return add_bindings(h, h, client.empty(16), 4)


@pytest.mark.parametrize(
    ("count", "match"),
    [
        ((2**31, 1, 1), "along x"),
        ((1, 65536, 1), "along y"),
        ((1, 1, 65536), "along z"),
        ((2**31, 2**31, 2**31), "along x"),
    ],
)
async def test_checked_launch_outside_the_limits_is_refused(
    client: ac.ComputeClient, count: tuple[int, int, int], match: str
) -> None:
    client.execute(ADD, ac.CubeCount(*count), _small_add(client))
    with pytest.raises(ac.InvalidArgument, match=f"kernel 'test_add_f32' on .*{match}"):
        await client.sync()
    await client.sync()  # the client keeps serving


@pytest.mark.parametrize("count", [(0, 1, 1), (1, 0, 1), (1, 1, 0)])
async def test_a_checked_launch_of_zero_cubes_is_refused_at_the_call(
    client: ac.ComputeClient, count: tuple[int, int, int]
) -> None:
    zero = r"execute: kernel 'test_add_f32': cube count .* zero dimension"
    with pytest.raises(ac.InvalidArgument, match=zero):
        client.execute(ADD, ac.CubeCount(*count), _small_add(client))
    await client.sync()  # nothing was queued, nothing held


async def test_a_block_too_large_is_refused(client: ac.ComputeClient) -> None:
    h = client.empty(4 * 2048)
    client.execute(BIG_BLOCK, ac.CubeCount(1), ac.Bindings().with_buffers([h]))
    with pytest.raises(ac.InvalidArgument, match=r"block \(1024, 2, 1\) exceeds"):
        await client.sync()


async def test_a_dynamic_zero_count_is_refused_when_checked(client: ac.ComputeClient) -> None:
    counts = client.create(np.array([0, 1, 1], np.uint32))
    client.execute(ADD, ac.CubeCount.dynamic(counts), _small_add(client))
    with pytest.raises(ac.InvalidArgument, match="zero dimension"):
        await client.sync()


async def test_unchecked_launches_are_not_validated(client: ac.ComputeClient) -> None:
    client.execute(ADD, ac.CubeCount(0), _small_add(client), mode=ac.ExecutionMode.UNCHECKED)
    await client.sync()


async def test_the_largest_counts_are_accepted_on_the_host() -> None:
    async with ac.open_client("host") as host_client:
        host_client.execute(NOOP, ac.CubeCount(2**31 - 1, 65535, 65535), ac.Bindings())
        await host_client.sync()


async def test_host_limits_are_cudas_documented_ones() -> None:
    assert HOST_LIMITS.max_grid == (2**31 - 1, 65535, 65535)
    assert grid_problem((2**31 - 1, 65535, 65535), HOST_LIMITS.max_grid) == ""
