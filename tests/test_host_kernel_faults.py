"""A host kernel that raises a ``BaseException`` (``SystemExit``, ``KeyboardInterrupt``,
``GeneratorExit``, a bare ``BaseException``) fails its launch, typed, and nothing else:
the worker thread goes on, later work on it (and on other streams) runs, ``close()``
completes (issue 37, point 4). And a launch with a zero dimension in its cube count runs
nothing on the host, as on a GPU (point 6). asyncio and trio."""

from __future__ import annotations

import anyio
import numpy as np
import pytest

import asynccube as ac

pytestmark = pytest.mark.anyio  # each backend: asyncio and trio

RAISED: list[type[BaseException]] = [SystemExit, KeyboardInterrupt, GeneratorExit, BaseException]


def _raiser(kind: type[BaseException]) -> ac.Kernel:
    def host(launch: ac.HostLaunch) -> None:
        launch.buffers[0][:] = 9
        raise kind("from the kernel")

    return ac.Kernel(f"test_faults_raises_{kind.__name__}", host=host)


def _fill(launch: ac.HostLaunch) -> None:
    launch.buffers[0][:] = 1


FILL = ac.Kernel("test_faults_fill", host=_fill)


def _host_only(client: ac.ComputeClient) -> None:
    if client.device != "host":
        pytest.skip("host kernels: a GPU runs none")


@pytest.mark.parametrize("kind", RAISED, ids=[k.__name__ for k in RAISED])
async def test_a_base_exception_fails_the_launch_not_the_worker(
    client: ac.ComputeClient, kind: type[BaseException]
) -> None:
    _host_only(client)
    h, other = client.create(b"\0" * 4), client.create(b"\0" * 4)
    with ac.StreamId.pinned(ac.StreamId(3)):
        client.execute(_raiser(kind), ac.CubeCount(1), ac.Bindings().with_buffers([h]))
        with anyio.fail_after(10):  # today: hangs forever (the worker is gone)
            with pytest.raises(ac.ExecutionError, match=kind.__name__) as info:
                await client.sync()
        assert type(info.value.__cause__) is kind
        assert f"test_faults_raises_{kind.__name__}" in str(info.value)
        with anyio.fail_after(10), pytest.raises(ac.TaintedBuffer):
            await client.read([h])  # what it half wrote is never read as a result
        client.execute(FILL, ac.CubeCount(1), ac.Bindings().with_buffers([other]))
        with anyio.fail_after(10):  # the same worker runs later work
            assert await client.read([other]) == [b"\x01" * 4]
    slot_of = client.server.stream_slot  # type: ignore[attr-defined]
    same = next(i for i in range(4, 10_000) if slot_of(ac.StreamId(i)) == slot_of(ac.StreamId(3)))
    with ac.StreamId.pinned(ac.StreamId(same)), anyio.fail_after(10):  # another stream there
        assert await client.read([client.create(b"ok")]) == [b"ok"]
    with anyio.fail_after(10):
        await client.close()


async def test_an_unawaited_base_exception_is_raised_by_close(client: ac.ComputeClient) -> None:
    _host_only(client)
    client.execute(_raiser(SystemExit), ac.CubeCount(1), ac.Bindings().with_buffer(client.empty(4)))
    with anyio.fail_after(10), pytest.raises(ac.ExecutionError, match="SystemExit") as info:
        await client.close()  # today: hangs (its worker never exits)
    assert type(info.value.__cause__) is SystemExit


SEVENS_CUDA = r"""
extern "C" __global__ void sevens(unsigned int* out) {
    if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = 0x07070707u;
}
"""


def _sevens(launch: ac.HostLaunch) -> None:
    launch.buffers[0][:] = 7


SEVENS = ac.Kernel(
    "test_faults_sevens",
    cuda=ac.CudaSource(SEVENS_CUDA, entry="sevens", block=(1, 1, 1)),
    host=_sevens,
)
"""Writes 07 07 07 07 into its buffer, on either server."""
ZERO_COUNTS = [(0, 1, 1), (1, 0, 1), (1, 1, 0), (0, 0, 0)]


@pytest.mark.parametrize("dims", ZERO_COUNTS, ids=str)
async def test_an_unchecked_launch_of_zero_cubes_runs_nothing(
    client: ac.ComputeClient, dims: tuple[int, int, int]
) -> None:
    h = client.create(b"\0" * 4)
    bindings = ac.Bindings().with_buffers([h])
    client.execute(SEVENS, ac.CubeCount(*dims), bindings, ac.ExecutionMode.UNCHECKED)
    assert await client.read([h]) == [b"\0" * 4]  # today on the host: 07070707


@pytest.mark.parametrize("dims", ZERO_COUNTS, ids=str)
@pytest.mark.parametrize("mode", list(ac.ExecutionMode), ids=lambda m: m.name)
async def test_a_dynamic_count_of_zero_cubes_runs_nothing(
    client: ac.ComputeClient, dims: tuple[int, int, int], mode: ac.ExecutionMode
) -> None:
    h = client.create(b"\0" * 4)
    count = ac.CubeCount.dynamic(client.create(np.array(dims, np.uint32)))
    client.execute(SEVENS, count, ac.Bindings().with_buffers([h]), mode)
    if mode is ac.ExecutionMode.CHECKED:  # read on the device: refused when it runs
        with pytest.raises(ac.InvalidArgument, match="zero dimension"):
            await client.sync()
        with pytest.raises(ac.TaintedBuffer):
            await client.read([h])
    else:
        assert await client.read([h]) == [b"\0" * 4]
