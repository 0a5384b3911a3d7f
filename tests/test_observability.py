"""Configuration, logging, profiling and the timeline, through a real client."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import asynccube as ac

from .kernels import ADD, add_bindings, blocks


async def _add_in_tasks(client: ac.ComputeClient, tasks: int) -> None:
    async def work() -> None:
        a = client.create(np.ones(64, np.float32))
        out = client.empty(256)
        client.execute(ADD, blocks(64), add_bindings(a, a, out, 64))
        await client.read([out])

    await asyncio.gather(*(work() for _ in range(tasks)))


@pytest.mark.asyncio
async def test_timeline_has_one_track_per_stream_and_one_event_per_kernel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ASYNCCUBE_PROFILING_LEVEL", "medium")
    async with ac.open_client("host") as client:
        await _add_in_tasks(client, 3)
        timeline = await client.timeline()
        path = await asyncio.to_thread(timeline.save, tmp_path / "trace.json")
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    kernels = [e for e in events if e.get("ph") == "X" and e["name"] == ADD.id]
    tracks = {e["tid"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert len(kernels) == 3
    assert len(tracks) == 3
    assert {e["tid"] for e in kernels} == tracks
    copies = [e for e in events if e.get("ph") == "X" and e["name"] in ("read", "write")]
    assert len(copies) == 6


@pytest.mark.asyncio
async def test_timeline_records_cross_stream_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCCUBE_PROFILING_LEVEL", "medium")
    async with ac.open_client("host") as client:
        shared = client.create(np.ones(64, np.float32))

        async def other() -> None:
            out = client.empty(256)
            client.execute(ADD, blocks(64), add_bindings(shared, shared, out, 64))
            await client.read([out])

        await asyncio.create_task(other())
        timeline = await client.timeline()
    waits = [r for r in timeline.records if r.kind == "wait"]
    assert waits, "the other task's stream waited for the creating stream"
    assert all(r.name.startswith("wait ") and r.end_ns >= r.start_ns for r in waits)


@pytest.mark.asyncio
async def test_nothing_is_recorded_when_profiling_is_disabled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ASYNCCUBE_PROFILING_LEVEL", "disabled")
    async with ac.open_client("host") as client:
        await _add_in_tasks(client, 2)
        assert len(await client.timeline()) == 0


@pytest.mark.asyncio
async def test_named_profiles_are_summarized(host_client: ac.ComputeClient) -> None:
    for _ in range(3):
        async with host_client.profile("step") as out:
            await _add_in_tasks(host_client, 1)
        assert out[0].method is ac.TimingMethod.FULL
    stats = host_client.profile_summary["step"]
    assert stats.count == 3
    assert stats.min_ns <= stats.mean_ns <= stats.max_ns
    assert "<table" in host_client.profile_summary._repr_html_()


@pytest.mark.asyncio
async def test_memory_report_and_html(host_client: ac.ComputeClient) -> None:
    keep = host_client.empty(100_000)
    report = await host_client.memory_report()
    assert report.usage.bytes_in_use >= 100_000
    assert report.usage == await host_client.memory_usage()
    html = report._repr_html_()
    assert "<table" in html and "total" in html
    assert "<table" in (await host_client.memory_usage())._repr_html_()
    del keep


@pytest.mark.asyncio
async def test_config_reaches_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCCUBE_STREAMING_MAX_STREAMS", "1")
    async with ac.open_client("host") as client:
        assert client.properties.extra["max_streams"] == 1
        await _add_in_tasks(client, 4)


@pytest.mark.asyncio
async def test_bad_config_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCCUBE_STREAMING_MAX_STREAMS", "many")
    with pytest.raises(ac.ConfigError, match="ASYNCCUBE_STREAMING_MAX_STREAMS"):
        await ac.connect("host")


@pytest.mark.asyncio
async def test_streaming_logs_a_cross_stream_wait(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("ASYNCCUBE_STREAMING_LOGGING", "basic")
    caplog.set_level(logging.DEBUG, logger="asynccube.streaming")
    async with ac.open_client("host") as client:
        shared = client.create(np.ones(64, np.float32))
        await client.sync()

        async def other() -> None:
            out = client.empty(256)
            client.execute(ADD, blocks(64), add_bindings(shared, shared, out, 64))
            await client.read([out])

        await asyncio.create_task(other())
    waits = [r for r in caplog.records if r.name == "asynccube.streaming"]
    assert any("Waiting on" in r.getMessage() for r in waits)
    assert all(r.levelno == logging.INFO for r in waits)


@pytest.mark.slow
def test_config_command_prints_sources(tmp_path: Path) -> None:
    (tmp_path / "asynccube.toml").write_text("[streaming]\nmax_streams = 3\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCCUBE_")}
    env["ASYNCCUBE_MEMORY_POOL"] = "exclusive"
    if "PYTHONPATH" in env:  # a source tree on a relative path: keep it valid from tmp_path
        paths = env["PYTHONPATH"].split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in paths if p)
    out = subprocess.run(
        [sys.executable, "-m", "asynccube", "config"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "max_streams = 3" in out and str(tmp_path / "asynccube.toml") in out
    assert "ASYNCCUBE_MEMORY_POOL" in out
