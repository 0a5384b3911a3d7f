"""Lifecycle: unclosed clients warn, a client outliving its loop says so, a close error
is never lost behind the block's exception, ExecutionError names the kernel (issue 10,
finding 8)."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest

import asynccube as ac


def _explode(launch: ac.HostLaunch) -> None:
    raise RuntimeError("deliberate failure")


FAIL = ac.Kernel("test_lifecycle_fail", host=_explode)


@pytest.mark.asyncio
async def test_an_unclosed_client_gives_a_resource_warning() -> None:
    client = await ac.connect("host")
    channel = client._channel
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del client
        gc.collect()
    assert any(
        issubclass(w.category, ResourceWarning) and "unclosed" in str(w.message) for w in caught
    )
    await channel.begin_close()
    await channel.wait_actor()


@pytest.mark.asyncio
@pytest.mark.allow_loop_lag  # gc.collect() on the loop, on purpose: a full collection
async def test_a_closed_client_gives_no_warning() -> None:
    client = await ac.connect("host")
    await client.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del client
        gc.collect()


def test_a_client_whose_loop_ended_says_to_reopen_it() -> None:
    client = asyncio.run(ac.connect("host"))  # asyncio.run cancels the actor at the end

    async def use() -> None:
        client.create(b"x")

    with pytest.raises(ac.ClientDeadError, match=r"event loop .* has ended.*running loop"):
        asyncio.run(use())


@pytest.mark.asyncio
async def test_a_held_error_is_not_lost_when_the_block_raises() -> None:
    async def block() -> None:
        async with ac.open_client("host") as client:
            client.execute(FAIL, ac.CubeCount(1), ac.Bindings())
            raise KeyError("the user's own error")

    with pytest.raises(KeyError) as info:
        await block()
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "closing the client also raised ExecutionError" in notes
    assert "test_lifecycle_fail" in notes


@pytest.mark.asyncio
async def test_an_execution_error_names_the_kernel(host_client: ac.ComputeClient) -> None:
    host_client.execute(FAIL, ac.CubeCount(1), ac.Bindings())
    with pytest.raises(ac.ExecutionError, match="kernel 'test_lifecycle_fail' failed"):
        await host_client.sync()


@pytest.mark.asyncio
async def test_close_from_another_loop_is_refused_and_leaves_the_client_open(
    host_client: ac.ComputeClient,
) -> None:
    """Issue 37, point 5: LoopMismatchError, as every other method, before any change."""

    def close_elsewhere() -> BaseException | None:
        try:
            asyncio.run(host_client.close())
        except BaseException as exc:
            return exc
        return None

    err = await asyncio.get_running_loop().run_in_executor(None, close_elsewhere)
    assert isinstance(err, ac.LoopMismatchError)
    assert not host_client.closed
    h = host_client.create(b"still open")
    assert await host_client.read([h]) == [b"still open"]


@pytest.mark.asyncio
async def test_close_again_after_close_is_a_no_op_from_anywhere() -> None:
    client = await ac.connect("host")
    await client.close()
    await asyncio.get_running_loop().run_in_executor(None, asyncio.run, client.close())
    assert client.closed
