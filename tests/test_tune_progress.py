"""Progress while tuning: a tqdm bar over a key's implementations where a person can see
it; nothing when no one can, or when the configuration turns it off."""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path

import pytest
from tqdm.auto import tqdm

import asynccube as ac
from asynccube._core.channel import progress
from asynccube._core.cli.demo import run_demo

from .tune_helpers import three_speeds, tuner


@pytest.mark.asyncio
async def test_tuning_shows_a_bar_per_key_when_interactive(
    host_client: ac.ComputeClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(progress, "interactive", lambda: True)
    every_step = functools.partial(tqdm, mininterval=0)  # no rate limit: each step drawn
    monkeypatch.setattr(progress, "_tqdm_class", lambda: every_step)
    t = tuner(tmp_path, samples=1)
    await t.execute(host_client, three_speeds(Counter()), 1000)
    err = capsys.readouterr().err
    assert "autotune test_tune" in err
    assert "3/3" in err  # one step per implementation
    assert "fast" in err  # the implementation just benchmarked is named


@pytest.mark.asyncio
async def test_no_bar_when_no_one_can_see_it(
    host_client: ac.ComputeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert not progress.interactive()  # pytest captures stderr: not a terminal
    await tuner(tmp_path, samples=1).execute(host_client, three_speeds(Counter()), 1000)
    assert "autotune" not in capsys.readouterr().err


@pytest.mark.asyncio
async def test_config_turns_the_bar_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "interactive", lambda: True)
    async with ac.open_client("host", config={"autotune": {"progress": False}}) as client:
        await tuner(tmp_path, samples=1).execute(client, three_speeds(Counter()), 1000)
    assert "autotune" not in capsys.readouterr().err


@pytest.mark.asyncio
async def test_silent_without_tqdm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "interactive", lambda: True)
    monkeypatch.setattr(progress, "_tqdm_class", lambda: None)
    bar = await progress.open_progress(3, "x")
    assert not bar.shown
    bar.step("a")  # a silent bar accepts steps
    bar.close()


@pytest.mark.asyncio
@pytest.mark.allow_loop_lag  # run_demo itself blocks the loop 6-7 ms here, with or without
async def test_demo_shows_progress_when_interactive(  # a bar (demo.py; reported to issue 10)
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "interactive", lambda: True)
    every_step = functools.partial(tqdm, mininterval=0)
    monkeypatch.setattr(progress, "_tqdm_class", lambda: every_step)
    report = await run_demo("host", tasks=3, elements=1024, rounds=1)
    assert report.ok
    err = capsys.readouterr().err
    assert "demo on host" in err and "3/3" in err
