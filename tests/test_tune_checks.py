"""Autotune checks: every implementation on the same inputs, outputs compared."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asynccube as ac

from .tune_helpers import SizeKey, size_key, tuner

Impl = Callable[[ac.ComputeClient, int], Awaitable[Any]]


def returning(value: Callable[[int], Any]) -> Impl:
    async def fn(client: ac.ComputeClient, n: int) -> Any:
        return value(n)

    return fn


async def _raises(client: ac.ComputeClient, n: int) -> Any:
    raise RuntimeError("cannot")


def array_set(**extra: Impl) -> ac.TunableSet[SizeKey, int, Any]:
    ts: ac.TunableSet[SizeKey, int, Any] = ac.TunableSet(size_key)
    ts.add(returning(lambda n: np.arange(n, dtype=np.float32)), "reference")
    ts.add(returning(lambda n: np.arange(n, dtype=np.float32) * (1 + 1e-7)), "close")
    for name, fn in extra.items():
        ts.add(fn, name)
    return ts


def _off_by_one(n: int) -> Any:
    out = np.arange(n, dtype=np.float32)
    out[3] += 1
    return out


@pytest.mark.asyncio
async def test_report_names_each_disagreeing_implementation(
    host_client: ac.ComputeClient, tmp_path: Path
) -> None:
    ts = array_set(
        off=returning(_off_by_one),
        short=returning(lambda n: np.arange(n - 1, dtype=np.float32)),
        raises=_raises,
    )
    report = await tuner(tmp_path).check(host_client, ts, 8)
    assert not report.ok
    assert report.reference == "reference"
    assert report.agreeing == ("close",)
    assert report.disagreeing == ("off", "short", "raises")
    details = {m.name: m for m in report.mismatches}
    assert details["off"].max_abs_diff == 1.0
    assert "(3,)" in details["off"].detail
    assert "shape" in details["short"].detail
    assert "RuntimeError: cannot" in details["raises"].detail
    assert "off [2]" in str(report)


@pytest.mark.asyncio
async def test_tolerances_and_reference_are_options(
    host_client: ac.ComputeClient, tmp_path: Path
) -> None:
    ts = array_set(off=returning(_off_by_one))
    loose = ac.TuneChecks(atol=1.5)
    assert (await tuner(tmp_path).check(host_client, ts, 8, loose)).ok
    by_off = ac.TuneChecks(reference="off")
    report = await tuner(tmp_path).check(host_client, ts, 8, by_off)
    assert report.reference == "off"
    assert set(report.disagreeing) == {"reference", "close"}


@pytest.mark.asyncio
async def test_tensor_outputs_are_read_back(host_client: ac.ComputeClient, tmp_path: Path) -> None:
    def tensor_of(values: Callable[[int], Any]) -> Impl:
        async def fn(client: ac.ComputeClient, n: int) -> ac.Tensor:
            return client.create_array(values(n))

        return fn

    ts: ac.TunableSet[SizeKey, int, ac.Tensor] = ac.TunableSet(size_key)
    ts.add(tensor_of(lambda n: np.ones(n, np.float32)), "ones")
    ts.add(tensor_of(lambda n: np.ones(n, np.float32)), "ones_too")
    ts.add(tensor_of(lambda n: np.zeros(n, np.float32)), "zeros")
    report = await tuner(tmp_path).check(host_client, ts, 4)
    assert report.agreeing == ("ones_too",)
    assert report.disagreeing == ("zeros",)


@pytest.mark.asyncio
async def test_raw_handles_need_a_converter(host_client: ac.ComputeClient, tmp_path: Path) -> None:
    async def handle(client: ac.ComputeClient, n: int) -> ac.Handle:
        return client.create(np.full(n, 2, np.int32))

    ts: ac.TunableSet[SizeKey, int, ac.Handle] = ac.TunableSet(size_key)
    ts.add(handle, "a").add(handle, "b")
    report = await tuner(tmp_path).check(host_client, ts, 4)
    assert not report.ok
    assert "convert" in report.mismatches[0].detail

    async def read(client: ac.ComputeClient, h: ac.Handle) -> Any:
        return await client.read_array(h, np.int32)

    report = await tuner(tmp_path).check(host_client, ts, 4, ac.TuneChecks(convert=read))
    assert report.ok
    assert report.agreeing == ("b",)


@pytest.mark.asyncio
async def test_tuner_checks_log_and_keep_reports(
    host_client: ac.ComputeClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    t = tuner(tmp_path, checks=True)
    with caplog.at_level(logging.WARNING, logger="asynccube.autotune"):
        await t.execute(host_client, array_set(off=returning(_off_by_one)), 8)
    assert t.runs == 1
    assert len(t.check_reports) == 1
    assert t.check_reports[0].disagreeing == ("off",)
    assert any("off" in r.getMessage() for r in caplog.records)
    assert t.result(host_client, SizeKey(8)) is not None  # not strict: still tuned


@pytest.mark.asyncio
async def test_strict_checks_fail_the_tuning(host_client: ac.ComputeClient, tmp_path: Path) -> None:
    t = tuner(tmp_path, checks=ac.TuneChecks(strict=True))
    with pytest.raises(ac.AutotuneCheckError) as info:
        await t.execute(host_client, array_set(off=returning(_off_by_one)), 8)
    assert isinstance(info.value, ac.AutotuneError)
    assert info.value.report.disagreeing == ("off",)  # type: ignore[attr-defined]
    assert t.result(host_client, SizeKey(8)) is None
    ok = tuner(tmp_path, name="strict_ok", checks=ac.TuneChecks(strict=True))
    await ok.execute(host_client, array_set(), 8)
    assert ok.check_reports[0].ok
