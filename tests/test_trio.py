"""Clients under trio: round trips, ordering and streams in nurseries, cancellation that
leaks nothing, and typed errors for calls from elsewhere (another thread, asyncio, a
finished run). The shared client suite also runs under trio (anyio's plugin); these
tests are about what is trio's own."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asynccube as ac

from .kernels import ADD, SLOW_FILL, add_bindings, blocks
from .tune_helpers import three_speeds, tuner

trio = pytest.importorskip("trio")

N = 256


def _slow(client: ac.ComputeClient, h: ac.Handle, seconds: float) -> None:
    bindings = (
        ac.Bindings()
        .with_buffer(h.binding())
        .with_scalar(np.float32, [seconds])
        .with_scalar(np.uint8, [1])
    )
    client.execute(SLOW_FILL, ac.CubeCount(1), bindings)


def test_round_trip() -> None:
    async def main() -> list[bytes]:
        async with ac.open_client("host") as client:
            a = np.arange(N, dtype=np.float32)
            ha, out = client.create(a), client.empty(4 * N)
            client.write([(ha.copy_descriptor((N,), (1,), 4), 2 * a)])
            client.execute(ADD, blocks(N), add_bindings(ha, ha, out, N))
            await client.sync()
            np.testing.assert_array_equal(await client.read_array(out, np.float32), 4 * a)
            usage = await client.memory_usage()
            assert usage.bytes_in_use >= 8 * N
            return await client.read([client.create(b"trio")])

    assert trio.run(main) == [b"trio"]


def test_connect_and_close_in_a_nursery_task() -> None:
    async def main() -> None:
        client = await ac.connect("host")

        async def sync() -> None:
            await client.sync()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sync)
        await client.close()
        await client.close()  # idempotent
        with pytest.raises(ac.ClientClosedError):
            client.empty(4)

    trio.run(main)


def test_nursery_tasks_get_their_own_streams_and_keep_order() -> None:
    async def one(client: ac.ComputeClient, i: int, out: dict[int, Any]) -> None:
        stream = ac.StreamId.current()
        h = client.create(np.zeros(N, np.float32))
        for step in range(20):
            client.write([(h.copy_descriptor((N,), (1,), 4), np.full(N, step, np.float32))])
            await trio.lowlevel.checkpoint()  # interleave with the other tasks
        client.execute(ADD, blocks(N), add_bindings(h, h, h, N))
        out[i] = (stream, ac.StreamId.current(), await client.read_array(h, np.float32))

    async def main() -> dict[int, Any]:
        out: dict[int, Any] = {}
        async with ac.open_client("host") as client, trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(one, client, i, out)
        return out

    out = trio.run(main)
    assert len({first for first, _, _ in out.values()}) == 8  # one stream per task
    for first, again, data in out.values():
        assert first == again
        np.testing.assert_array_equal(data, np.full(N, 38, np.float32))


def test_streams_run_concurrently() -> None:
    # Two tasks each wait on a 0.2 s kernel: on separate streams (host workers) they
    # overlap, so both finish well under the 0.4 s they would take in sequence.
    async def one(client: ac.ComputeClient) -> None:
        h = client.empty(16)
        _slow(client, h, 0.2)
        await client.sync()

    async def main() -> float:
        async with ac.open_client("host") as client:
            start = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(one, client)
                nursery.start_soon(one, client)
            return trio.current_time() - start

    assert trio.run(main) < 0.35


@pytest.mark.parametrize("what", ["read", "sync"])
def test_cancelled_await_leaks_nothing_and_the_client_serves(what: str) -> None:
    async def main() -> None:
        async with ac.open_client("host") as client:
            await client.sync()
            before = await client.memory_usage()
            h = client.empty(4 * N)
            _slow(client, h, 0.1)
            with trio.move_on_after(0.01) as scope:
                if what == "read":
                    await client.read([h])
                else:
                    await client.sync()
            assert scope.cancelled_caught
            del h
            gc.collect()
            await client.sync()
            after = await client.memory_usage()
            assert (after.number_allocs, after.bytes_in_use) == (
                before.number_allocs,
                before.bytes_in_use,
            )
            assert await client.read([client.create(b"ok")]) == [b"ok"]
            assert not client._channel._pending  # the cancelled future was dropped

    trio.run(main)


def test_cancelling_a_nursery_of_readers() -> None:
    async def reader(client: ac.ComputeClient, h: ac.Handle) -> None:
        while True:
            await client.read([h])

    async def main() -> None:
        async with ac.open_client("host") as client:
            h = client.create(bytes(1024))
            async with trio.open_nursery() as nursery:
                for _ in range(16):
                    nursery.start_soon(reader, client, h)
                await trio.sleep(0.05)
                nursery.cancel_scope.cancel()
            assert await client.read([h]) == [bytes(1024)]

    trio.run(main)


def test_a_call_from_another_thread_raises_and_the_client_serves() -> None:
    errors: list[BaseException] = []

    async def main() -> None:
        async with ac.open_client("host") as client:

            def from_thread() -> None:
                try:
                    client.create(b"x")
                except ac.AsyncCubeError as exc:
                    errors.append(exc)

            thread = threading.Thread(target=from_thread)
            thread.start()
            await trio.to_thread.run_sync(thread.join)
            # The way in from a thread: trio.from_thread with the client's token.
            data = await trio.to_thread.run_sync(_read_from_thread, client)
            assert data == [b"via token"]

    trio.run(main)
    assert len(errors) == 1 and isinstance(errors[0], ac.LoopMismatchError)
    assert "trio" in str(errors[0]) and "trio_token" in str(errors[0])
    assert "make the handler `async def`" in str(errors[0])  # issue 37, point 18


def _read_from_thread(client: ac.ComputeClient) -> list[bytes]:
    async def job() -> list[bytes]:
        return await client.read([client.create(b"via token")])

    result: list[bytes] = trio.from_thread.run(job, trio_token=client.loop.token)  # type: ignore[attr-defined]
    return result


def test_a_trio_client_used_under_asyncio_raises() -> None:
    async def main() -> None:
        async with ac.open_client("host") as client:
            h = client.empty(4)
            _slow(client, h, 0.2)
            fut = client.read([h])  # pending while asyncio awaits it
            errors = await trio.to_thread.run_sync(asyncio.run, _use_from_asyncio(client, fut))
            assert [type(e) for e in errors] == [ac.LoopMismatchError] * 3
            assert await fut == [b"\x01" * 4]  # still served, here

    trio.run(main)


async def _use_from_asyncio(client: ac.ComputeClient, fut: Any) -> list[BaseException]:
    errors: list[BaseException] = []
    for call in (lambda: client.empty(4), lambda: client.sync()):
        try:
            call()
        except ac.AsyncCubeError as exc:
            errors.append(exc)
    try:
        await fut  # a trio future, awaited in an asyncio task
    except ac.AsyncCubeError as exc:
        errors.append(exc)
    return errors


def test_an_asyncio_client_used_under_trio_raises() -> None:
    async def main() -> None:
        async with ac.open_client("host") as client:
            error = await asyncio.to_thread(trio.run, _use_from_trio, client)
            assert isinstance(error, ac.LoopMismatchError)
            assert "asyncio" in str(error)
            await client.sync()

    asyncio.run(main())


async def _use_from_trio(client: ac.ComputeClient) -> BaseException | None:
    try:
        client.empty(4)
    except ac.AsyncCubeError as exc:
        return exc
    return None


def test_a_client_from_another_trio_run_raises() -> None:
    async def open_one() -> ac.ComputeClient:
        return await ac.connect("host")

    client = trio.run(open_one)  # its run ends with the client still open

    async def use() -> None:
        with pytest.raises(ac.ClientDeadError, match="event loop this client ran on has ended"):
            client.empty(4)

    trio.run(use)


def test_the_fd_watch_of_long_gpu_waits_works_under_trio() -> None:
    # The CUDA completion's long-wait path (cuda.completion._Watch) uses call_soon,
    # call_later, add_reader and remove_reader on the client's loop: the same calls here,
    # on a pipe, through the trio adapter.
    async def main() -> list[str]:
        async with ac.open_client("host") as client:
            loop = client.loop
            seen: list[str] = []
            r, w = os.pipe()
            done = trio.Event()

            def readable() -> None:
                seen.append(os.read(r, 1).decode())
                loop.remove_reader(r)
                done.set()

            r2, w2 = os.pipe()
            loop.add_reader(r2, lambda: seen.append("closed"))  # removed before it starts,
            loop.remove_reader(r2)  # and the descriptor closed at once: never waited on
            os.close(r2), os.close(w2)
            loop.add_reader(r, readable)
            timer = loop.call_later(0.01, lambda: seen.append("timer"))
            loop.call_later(10, lambda: seen.append("never")).cancel()
            loop.call_soon(seen.append, "soon")
            await trio.sleep(0.03)
            assert timer.when() <= loop.time()
            os.write(w, b"x")
            await done.wait()
            os.close(r), os.close(w)
            return seen

    assert trio.run(main) == ["soon", "timer", "x"]


def test_a_failing_loop_callback_is_logged_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with ac.open_client("host") as client:
            client.loop.call_soon(lambda: 1 / 0)
            await trio.sleep(0.01)
            await client.sync()

    with warnings.catch_warnings():
        trio.run(main)
    assert "ZeroDivisionError" in caplog.text


def test_a_graph_capture_belongs_to_its_trio_task() -> None:
    async def main() -> None:
        async with ac.open_client("host") as client:
            h = client.create(np.zeros(N, np.float32))
            async with client.capture() as graph:
                client.execute(ADD, blocks(N), add_bindings(h, h, h, N))
            graph.replay()
            assert (await client.read_array(h, np.float32) == 0).all()

    trio.run(main)


@pytest.mark.parametrize("mode", ["blocking", "background"])
def test_autotune_under_trio(tmp_path: Path, mode: str) -> None:
    # Tuning runs in a task of its own (a trio system task here), shared by concurrent
    # callers; its disk cache is read and written in worker threads.
    async def main() -> list[str]:
        calls: Counter[str] = Counter()
        ts = three_speeds(calls)
        t = tuner(tmp_path, mode=ac.TuneMode(mode))
        out: list[str] = []
        async with ac.open_client("host") as client:

            async def call() -> None:
                out.append(await t.execute(client, ts, 1000))

            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(call)
            await t.wait()
            out.append(await t.execute(client, ts, 1000))
            assert t.runs == 1
        return out

    out = trio.run(main)
    assert out[-1] == "fast"
    if mode == "blocking":
        assert out == ["fast"] * 6


class _EventCompletion:
    """A completion that can only be polled (like a bare CUDA event): done once set."""

    def __init__(self) -> None:
        self.flag = threading.Event()

    def done(self) -> bool:
        return self.flag.is_set()

    def result(self) -> str:
        return "done"

    def wait(self, timeout: float | None) -> bool:
        return self.flag.wait(timeout)


@pytest.mark.parametrize("when", ["short", "long"])
def test_polled_completions_resolve_under_trio(when: str) -> None:
    # The watcher polls such a completion from its poller task for a short spin, then
    # hands it to a waiter thread: both paths, on the trio loop.
    from asynccube._core.channel.completion import CompletionWatcher

    async def main() -> tuple[list[str], int]:
        async with ac.open_client("host") as client:
            channel = client._channel
            watcher = CompletionWatcher(client.loop, channel.backend.checkpoint)
            completion, got = _EventCompletion(), trio.Event()
            seen: list[str] = []

            def sink(c: Any) -> None:
                seen.append(c.result())
                got.set()

            watcher.watch(completion, sink)
            if when == "short":
                completion.flag.set()
            else:
                await trio.sleep(0.01)  # past the spin: a waiter thread takes it
                completion.flag.set()
            await got.wait()
            watcher.shutdown()
            return seen, watcher.handed_to_threads

    seen, handed = trio.run(main)
    assert seen == ["done"]
    assert handed == (1 if when == "long" else 0)


def test_close_from_another_run_or_loop_is_refused_and_leaves_the_client_open() -> None:
    """Issue 37, point 5: close() from asyncio or another trio run raises
    LoopMismatchError before any change; the client keeps serving its own run."""

    async def close_in_trio(client: ac.ComputeClient) -> None:
        await client.close()

    def close_elsewhere(client: ac.ComputeClient) -> list[BaseException]:
        errors: list[BaseException] = []
        for run in (lambda: asyncio.run(client.close()), lambda: trio.run(close_in_trio, client)):
            try:
                run()
            except BaseException as exc:
                errors.append(exc)
        return errors

    async def main() -> None:
        async with ac.open_client("host") as client:
            errors = await trio.to_thread.run_sync(close_elsewhere, client)
            assert [type(e) for e in errors] == [ac.LoopMismatchError] * 2
            assert not client.closed
            assert await client.read([client.create(b"open")]) == [b"open"]

    trio.run(main)


def test_a_close_while_the_run_ends_raises_nothing() -> None:
    """Issue 37, point 7 under trio: the run's end cancels the actor and a service's
    system task together; the service's (shielded) close must neither raise (a wakeup
    future cancelled with the actor) nor wait forever."""
    outcome: list[object] = []

    async def service(client: ac.ComputeClient, order: int) -> None:
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                try:
                    with trio.fail_after(10):
                        await client.close()
                    outcome.append(order)
                except BaseException as exc:
                    outcome.append(exc)

    async def main() -> None:
        for order in range(4):  # the order the run's end cancels system tasks in varies
            client = await ac.connect("host")
            trio.lowlevel.spawn_system_task(service, client, order)
        await trio.lowlevel.checkpoint()

    trio.run(main)
    assert sorted(outcome, key=str) == [0, 1, 2, 3]


def test_a_dropped_client_warns_where_it_was_opened() -> None:
    """Issue 37, point 17 under trio: one ResourceWarning naming the line that opened it."""

    async def main() -> tuple[list[warnings.WarningMessage], int]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            client = await ac.connect("host")
            line = _line() - 1
            client = await ac.connect("host")  # run again: the first one is dropped
            gc.collect()
            await client.close()
        return caught, line

    caught, line = trio.run(main)
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert len(unclosed) == 1 and f"opened at {__file__}:{line}" in unclosed[0], unclosed


def _line() -> int:
    import inspect

    return inspect.currentframe().f_back.f_lineno  # type: ignore[union-attr]
