"""After ``await client.sync()``, ``memory_usage()`` counts every handle dropped before
the sync as free, on each device and backend, without the garbage collector: those of
tasks cancelled just before it included (their frames unwind before the sync returns).
On the CUDA server's one-call sync (``FastSync``) the same is checked here, without a
GPU, on the no-op driver (``sync_memory_scenario.py``, both hot paths)."""

from __future__ import annotations

import pytest

import asynccube as ac

from .conftest import native_module
from .sync_storm import cancelled_reads_then_usage, storm_then_usage
from .test_fast_launch import _run


@pytest.mark.anyio
@pytest.mark.allow_loop_lag  # 900 buffers taken back in one memory_usage step
async def test_a_sync_frees_what_cancelled_tasks_held(client: ac.ComputeClient) -> None:
    await client.sync()
    before = await client.memory_usage()
    after = await storm_then_usage(client)
    assert (after.number_allocs, after.bytes_in_use) == (
        before.number_allocs,
        before.bytes_in_use,
    ), f"before {before}, after {after}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("twin", [False, True], ids=["native", "python"])
def test_the_cuda_one_call_sync_frees_what_cancelled_tasks_held(twin: bool) -> None:
    if not twin and native_module() is None:
        pytest.skip("the compiled extension is not built here (pip install . builds it)")
    out = _run("sync_memory_scenario.py", twin)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"ok cancelled_before_sync {'python' if twin else 'native'}" in out.stdout


@pytest.mark.anyio
@pytest.mark.allow_loop_lag  # 3,000 buffers taken back in one memory_usage step
async def test_a_sync_frees_what_tasks_cancelled_inside_a_read_held(
    client: ac.ComputeClient,
) -> None:
    """Issue 37, point 10: tasks cancelled while they await a read (not while they
    sleep): once they have ended, one ``await client.sync()`` is enough for
    ``memory_usage()`` to count every buffer of theirs as free."""
    await client.sync()
    before = await client.memory_usage()
    cancelled, after = await cancelled_reads_then_usage(client)
    assert cancelled > 200
    assert (after.number_allocs, after.bytes_in_use) == (
        before.number_allocs,
        before.bytes_in_use,
    ), f"{cancelled} tasks cancelled; before {before}, after {after}"
