"""The blocking pool (``channel/blocking.py``): blocking jobs of any asyncio loop run on
threads started without making the loop wait (``threading.Thread.start`` waits until
the new thread runs: milliseconds on a loaded host, on the loop). Opening a client on a
new loop starts no thread that way; jobs deliver results and errors, a job cancelled
before it starts is skipped, the pool stays within its threads, and a forked child gets
a pool of its own."""

from __future__ import annotations

import asyncio
import contextvars
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

import asynccube as ac
from asynccube._core.channel import backend, blocking


@pytest.mark.asyncio
async def test_opening_a_client_never_waits_for_a_thread_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every ``Thread.start`` made on the loop's thread while clients open, run blocking
    jobs and close is recorded (as on a loaded host, each would hold the loop until the
    new thread ran): none."""
    loop_thread = threading.get_ident()
    on_loop: list[str] = []
    real = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if threading.get_ident() == loop_thread:
            on_loop.append(self.name)
        real(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    async with ac.open_client("host") as c0, ac.open_client("host") as c1:
        assert await c0.read([c0.create(b"a")]) == [b"a"]
        assert await c1.read([c1.create(b"b")]) == [b"b"]
        await backend.run_blocking(time.sleep, 0.001)
        await backend.to_thread(time.sleep, 0.001)
    assert on_loop == []


@pytest.mark.asyncio
async def test_results_errors_and_context_come_back() -> None:
    assert await backend.run_blocking(sum, [1, 2, 3]) == 6
    with pytest.raises(ZeroDivisionError):
        await backend.run_blocking(lambda: 1 / 0)
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var")
    var.set("the caller's")
    assert await backend.to_thread(var.get) == "the caller's"
    assert await backend.current_backend("test").run_sync(max, 4, 9) == 9


@pytest.mark.asyncio
async def test_a_job_cancelled_before_it_starts_is_skipped() -> None:
    pool = blocking.BlockingPool(limit=1)
    loop = asyncio.get_running_loop()
    release, ran = threading.Event(), []
    first = pool.submit(loop, release.wait, 10)
    second = pool.submit(loop, ran.append, "second")
    second.cancel()
    release.set()
    assert await first is True
    third = pool.submit(loop, ran.append, "third")
    await third
    assert ran == ["third"] and pool.threads == 1


@pytest.mark.asyncio
async def test_the_pool_starts_threads_only_as_jobs_need_them_and_within_its_limit() -> None:
    pool = blocking.BlockingPool(limit=3)
    loop = asyncio.get_running_loop()
    for _ in range(5):  # one at a time: the one thread serves them all
        await pool.submit(loop, time.sleep, 0)
    assert pool.threads == 1
    release = threading.Event()
    held = [pool.submit(loop, release.wait, 10) for _ in range(5)]  # 5 at once, 3 threads
    later = pool.submit(loop, lambda: "after the backlog")
    await asyncio.sleep(0.05)
    assert pool.threads == 3 and not later.done()
    release.set()
    assert await asyncio.gather(*held) == [True] * 5
    assert await later == "after the backlog"
    for _ in range(5):  # the backlog is gone: the threads are idle again, none is added
        await pool.submit(loop, time.sleep, 0)
    assert pool.threads == 3


@pytest.mark.asyncio
async def test_a_result_for_a_closed_loop_is_dropped() -> None:
    other = asyncio.new_event_loop()
    release = threading.Event()
    pool = blocking.BlockingPool(limit=1)
    fut: Any = pool.submit(other, release.wait, 10)
    other.close()
    release.set()  # the job ends after its loop closed: call_soon_threadsafe refuses
    loop = asyncio.get_running_loop()
    assert await pool.submit(loop, lambda: "the pool serves on") == "the pool serves on"
    assert not fut.done()


_FORK = """
import asyncio, os, sys
from asynccube._core.channel import blocking

async def job():
    return await blocking.pool.submit(asyncio.get_running_loop(), sum, [1, 2])

assert asyncio.run(job()) == 3 and blocking.pool.threads >= 1
pid = os.fork()
if pid == 0:  # the parent's threads do not exist here: the child starts its own
    os._exit(0 if asyncio.run(asyncio.wait_for(job(), 10)) == 3 else 1)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_runs_jobs_on_threads_of_its_own() -> None:
    out = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", _FORK],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.split() == ["0"], out.stderr


@pytest.mark.asyncio
async def test_a_thread_that_cannot_start_leaves_the_pool_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = blocking.BlockingPool(limit=1)
    loop = asyncio.get_running_loop()
    real = blocking._thread.start_new_thread

    def refuse(*args: Any) -> Any:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(blocking._thread, "start_new_thread", refuse)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        pool.submit(loop, lambda: "never queued")
    assert pool.threads == 0
    monkeypatch.setattr(blocking._thread, "start_new_thread", real)
    assert await pool.submit(loop, lambda: "served") == "served"  # the one thread starts now
    assert pool.threads == 1


@pytest.mark.asyncio
async def test_a_result_that_cannot_be_delivered_is_reported_and_the_thread_serves_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = blocking.BlockingPool(limit=1)
    loop = asyncio.get_running_loop()
    reported: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    real = blocking.deliver
    failed = threading.Event()

    def broken(*args: Any) -> None:
        monkeypatch.setattr(blocking, "deliver", real)
        failed.set()
        raise MemoryError("a loop's own failure")

    monkeypatch.setattr(blocking, "deliver", broken)
    lost = pool.submit(loop, lambda: "lost")
    assert await backend.to_thread(failed.wait, 10)
    assert await pool.submit(loop, lambda: "next") == "next"  # the same thread, alive
    assert pool.threads == 1 and not lost.done()
    (report,) = reported
    assert isinstance(report.exc_value, MemoryError) and "result" in report.err_msg
    lost.cancel()
