"""Lifecycle: unclosed clients warn, a client outliving its loop says so, a close error
is never lost behind the block's exception, ExecutionError names the kernel (issue 10,
finding 8)."""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import warnings
from collections.abc import Callable, Coroutine
from typing import Any

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


def _run_collecting(main: Callable[[], Coroutine[Any, Any, None]]) -> list[dict[str, Any]]:
    """Run ``main`` in a fresh loop (torn down as ``asyncio.run`` does); what the loop's
    exception handler got."""
    reported: list[dict[str, Any]] = []
    with asyncio.Runner() as runner:
        runner.get_loop().set_exception_handler(lambda _, context: reported.append(context))
        runner.run(main())
    return reported


def test_a_close_during_the_loops_teardown_raises_nothing() -> None:
    """Issue 37, point 7: a service stopped by a second Ctrl-C: its task and the actor
    are cancelled in one step (the teardown cancels every task), the service's task
    first; its close ran ``_wake`` on the actor's cancelled future (InvalidStateError)."""
    noted: list[BaseException] = []

    async def service(ready: asyncio.Future[ac.ComputeClient]) -> None:
        try:
            async with ac.open_client("host") as client:
                ready.set_result(client)
                await asyncio.sleep(10)
        except asyncio.CancelledError as exc:
            noted.append(exc)
            raise

    async def main() -> None:
        ready: asyncio.Future[ac.ComputeClient] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(service(ready))
        client = await ready
        task.cancel()  # as the teardown does, the service's task before the actor's
        client._channel._actor.cancel()
        await asyncio.wait([task])

    assert _run_collecting(main) == []
    assert len(noted) == 1 and not getattr(noted[0], "__notes__", None)


def test_a_close_of_a_client_whose_actor_never_ran_ends() -> None:
    """A loop torn down right after the open: the actor is cancelled before its first
    step (no ``except`` of its own runs); the close ends instead of waiting forever."""

    async def main() -> None:
        client = await ac.connect("host")
        client.create(b"queued")  # before the actor's first step: queued for it
        client._channel._actor.cancel()
        await asyncio.wait_for(client.close(), 10)
        assert client.closed

    assert _run_collecting(main) == []


def test_a_dropped_client_warns_where_it_was_opened_and_asyncio_says_nothing() -> None:
    """Issue 37, point 17: a notebook cell run again (``client = await ac.connect()``)
    drops the first client: one ResourceWarning naming it and the line that opened it,
    and no "Task was destroyed but it is pending!" from asyncio for its actor."""
    logged: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = logged.append  # type: ignore[method-assign]
    asyncio_log = logging.getLogger("asyncio")
    asyncio_log.addHandler(handler)

    async def cell() -> None:
        client = await ac.connect("host")  # the line the warning names
        line = inspect.currentframe().f_lineno - 1  # type: ignore[union-attr]
        client.create(b"x")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            client = await ac.connect("host")  # run again: the first one is dropped
            gc.collect()  # its actor's task goes with it
            await asyncio.sleep(0)
            gc.collect()
        unclosed = [w for w in caught if issubclass(w.category, ResourceWarning)]
        assert len(unclosed) == 1, [str(w.message) for w in caught]
        text = str(unclosed[0].message)
        assert "unclosed ComputeClient(device='host'" in text
        assert f"opened at {__file__}:{line}" in text
        await client.close()

    try:
        asyncio.run(cell())
        gc.collect()
    finally:
        asyncio_log.removeHandler(handler)
    assert not [r for r in logged if "destroyed" in r.getMessage()], logged
