"""The loop monitor (``ac.LoopMonitor``) on asyncio and trio: it catches a step that
blocks the loop and names the code behind it (snapshot, ``on_report``, the log line),
sees the lag a block causes, hooks nothing while off, and refuses bad settings at the
call. The assertions look for the blocking step among those recorded: a noisy machine
may add slow steps, never hide the one the test made."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from asyncio import events

import anyio
import anyio.lowlevel
import pytest

import asynccube as ac
from _asynccube_pytest import lagprobe

pytestmark = pytest.mark.anyio
BLOCK = 0.05


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def block_the_loop() -> None:
    time.sleep(BLOCK)  # the blocking call a service must never make on its loop


async def blocking_handler() -> None:
    block_the_loop()


def _names(report: ac.LoopLagReport, name: str) -> bool:
    return any(name in s.culprit and s.seconds >= BLOCK for s in report.slow_steps)


async def _block_once(anyio_backend: str) -> None:
    """Block the loop for BLOCK seconds: a plain callback on asyncio (and a task step),
    a task step on trio."""
    await anyio.sleep(0.03)  # the ticker is asleep, so the block makes it late
    if anyio_backend == "asyncio":
        asyncio.get_running_loop().call_soon(block_the_loop)
        await asyncio.sleep(0.01)
        await asyncio.create_task(blocking_handler(), name="handler")
    else:
        import trio

        async with trio.open_nursery() as nursery:
            nursery.start_soon(blocking_handler, name="handler")
    await anyio.sleep(0.03)


@pytest.mark.allow_loop_lag
async def test_a_blocking_step_is_caught_and_named(
    anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="asynccube.loop")
    reports: list[ac.LoopLagReport] = []
    monitor = ac.LoopMonitor(threshold=0.04, on_report=reports.append, step_sampling=1.0)
    monitor.start()
    try:
        await _block_once(anyio_backend)
        snapshot = monitor.snapshot()
    finally:
        monitor.stop()
    name = "'handler' running blocking_handler"  # the task, by its name and coroutine
    assert _names(snapshot, name), snapshot.slow_steps
    if anyio_backend == "asyncio":  # and the plain callback
        assert _names(snapshot, "block_the_loop"), snapshot.slow_steps
    assert snapshot.worst_step is not None and snapshot.worst_step.seconds >= BLOCK
    # The ticker slept through the block: it woke at least BLOCK - interval late.
    assert snapshot.max >= BLOCK - monitor.interval - 0.005
    assert snapshot.samples >= 1 and snapshot.p50 <= snapshot.p99 <= snapshot.max
    assert len(reports) == 1 and _names(reports[0], name)  # stop() delivers a last one
    logged = [r.getMessage() for r in caplog.records if r.name == "asynccube.loop"]
    assert any("blocked for" in m and name in m for m in logged), logged
    json.dumps(snapshot.as_dict())  # ready for a /health endpoint


@pytest.mark.allow_loop_lag
async def test_a_slow_step_says_where_its_task_stopped(anyio_backend: str) -> None:
    """A task's slow step is named with where the task stopped at its end: the line of
    its next await (the step ran from its previous await to there)."""
    lines: list[int] = []

    async def handler() -> None:
        await anyio.lowlevel.checkpoint()
        block_the_loop()
        lines.append(sys._getframe().f_lineno + 1)
        await anyio.sleep(0.01)

    async with ac.LoopMonitor(threshold=0.04, step_sampling=1.0) as monitor:
        await anyio.sleep(0.03)
        async with anyio.create_task_group() as tg:
            tg.start_soon(handler)
        snapshot = monitor.snapshot()
    (step,) = [s for s in snapshot.slow_steps if s.seconds >= BLOCK]
    assert step.culprit.endswith(f", which ended at test_loop_monitor.py:{lines[0]}"), step.culprit


@pytest.mark.allow_loop_lag
async def test_reports_come_every_report_every_seconds(anyio_backend: str) -> None:
    reports: list[ac.LoopLagReport] = []
    async with ac.LoopMonitor(report_every=0.05, on_report=reports.append, step_sampling=1):
        await _block_once(anyio_backend)
        await anyio.sleep(0.2)
    assert len(reports) >= 2
    assert any(_names(r, "handler") for r in reports)


@pytest.mark.allow_loop_lag
async def test_sampled_steps_name_code_that_blocks_again_and_again(
    anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """At the default sampling, steps are timed one tick in ten; a block the ticker
    alone saw is logged as such, and steps are then timed for ``burst`` seconds."""
    caplog.set_level(logging.WARNING, logger="asynccube.loop")
    # An untimed block of 50 ms wakes the 10 ms ticker at least 40 ms late: above 30 ms.
    async with ac.LoopMonitor(threshold=0.03) as monitor:
        assert monitor.step_sampling == 0.1
        for _ in range(6):
            await _block_once(anyio_backend)
        snapshot = monitor.snapshot()
    assert _names(snapshot, "'handler' running blocking_handler"), snapshot.slow_steps


async def test_steps_are_timed_in_one_tick_of_ten_by_default(anyio_backend: str) -> None:
    seen: list[bool] = []
    async with ac.LoopMonitor(interval=0.002) as monitor:
        for _ in range(60):
            seen.append(monitor._hooked)
            await anyio.sleep(0.002)
    assert True in seen and False in seen


async def test_a_failing_on_report_is_logged_not_raised(
    anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(report: ac.LoopLagReport) -> None:
        raise RuntimeError("on_report broke")

    caplog.set_level(logging.ERROR, logger="asynccube.loop")
    async with ac.LoopMonitor(report_every=0.02, on_report=broken):
        await anyio.sleep(0.1)
    assert any("on_report raised" in r.getMessage() for r in caplog.records)


async def test_nothing_is_hooked_while_off(anyio_backend: str) -> None:
    original = lagprobe._original_run
    monitor = ac.LoopMonitor()
    assert events.Handle._run is original or anyio_backend == "asyncio"
    monitor.start()
    assert monitor.running
    if anyio_backend == "asyncio":
        assert events.Handle._run is not original
    monitor.stop()
    monitor.stop()  # a second stop does nothing
    assert not monitor.running
    # The plugin's own probe may still hook this loop; the monitor's hook is gone.
    assert all(monitor not in sinks for sinks in lagprobe._sinks.values())
    if anyio_backend == "trio":
        import trio

        runner = trio.lowlevel.current_root_task()
        assert runner is not None
    monitor.start()  # it can start again
    monitor.stop()


async def test_a_quiet_loop_reports_samples(anyio_backend: str) -> None:
    async with ac.LoopMonitor(interval=0.005) as monitor:
        await anyio.sleep(0.1)
        report = monitor.snapshot()
    assert report.samples >= 3
    assert 0 <= report.p50 <= report.p99 <= report.max
    assert report.window > 0


async def test_starting_twice_is_refused(anyio_backend: str) -> None:
    async with ac.LoopMonitor() as monitor:
        with pytest.raises(ac.InvalidArgument, match="running already"):
            monitor.start()


def test_start_outside_a_loop_is_refused() -> None:
    with pytest.raises(ac.LoopMismatchError, match="running asyncio or trio"):
        ac.LoopMonitor().start()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"interval": 0},
        {"window": -1},
        {"threshold": float("nan")},
        {"report_every": float("inf")},
        {"interval": "10ms"},
        {"interval": True},
        {"record_above": 0.2, "threshold": 0.1},
        {"on_report": 3},
        {"step_sampling": 1.5},
        {"step_sampling": 0},
        {"burst": 0},
    ],
)
def test_bad_settings_are_refused_at_the_call(kwargs: dict[str, object]) -> None:
    with pytest.raises(ac.InvalidArgument, match="LoopMonitor"):
        ac.LoopMonitor(**kwargs)  # type: ignore[arg-type]


async def test_watches_a_client_at_work(
    anyio_backend: str, asynccube_client: ac.ComputeClient
) -> None:
    client = asynccube_client
    async with ac.LoopMonitor(interval=0.005) as monitor:
        for _ in range(20):
            assert await client.read([client.create(b"watched")]) == [b"watched"]
        await anyio.sleep(0.03)
        report = monitor.snapshot()
    assert report.samples >= 1


def test_a_monitor_never_stopped_unhooks_when_its_loop_ends() -> None:
    monitor = ac.LoopMonitor()

    async def main() -> None:
        monitor.start()
        await asyncio.sleep(0.02)

    asyncio.run(main())
    assert not monitor.running
    assert events.Handle._run is lagprobe._original_run
    assert not lagprobe._sinks


def test_a_monitor_never_stopped_under_trio_ends_with_its_run() -> None:
    trio = pytest.importorskip("trio")
    monitor = ac.LoopMonitor()

    async def main() -> None:
        monitor.start()
        await trio.sleep(0.02)

    trio.run(main)
    assert not monitor.running
