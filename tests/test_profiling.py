"""Profiler tokens (nested, overlapping, errors), kernel records and summaries."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asynccube._core.config.config import ProfilingConfig, ProfilingLevel
from asynccube._core.errors import InvalidArgument, ProfileError
from asynccube._core.profiling.display import profile_summary_html
from asynccube._core.profiling.records import (
    KernelRecord,
    KernelRecorder,
    Profiler,
    ProfileSummary,
    format_ns,
)
from asynccube._core.values.types import ProfileDuration, ProfilingToken, TimingMethod


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now

    def advance(self, ns: int) -> None:
        self.now += ns


def test_nested_profiles_outer_contains_inner() -> None:
    clock = FakeClock()
    prof: Profiler[None] = Profiler(clock)
    outer = prof.start()
    clock.advance(10)
    inner = prof.start()
    clock.advance(25)
    d_inner = prof.end(inner)
    clock.advance(5)
    d_outer = prof.end(outer)
    assert d_inner.duration_ns == 25
    assert d_outer.duration_ns == 40
    assert d_outer.duration_ns >= d_inner.duration_ns
    assert d_outer.start_ns <= d_inner.start_ns <= d_inner.end_ns <= d_outer.end_ns
    assert d_outer.method is TimingMethod.FULL
    assert len(prof) == 0


def test_overlapping_profiles_are_independent() -> None:
    clock = FakeClock()
    prof: Profiler[None] = Profiler(clock)
    a = prof.start()
    clock.advance(10)
    b = prof.start()
    clock.advance(10)
    d_a = prof.end(a)  # a ends while b is still running
    clock.advance(30)
    d_b = prof.end(b)
    assert (d_a.duration_ns, d_b.duration_ns) == (20, 40)
    assert d_a.start_ns < d_b.start_ns < d_a.end_ns < d_b.end_ns
    assert a != b


def test_tokens_are_distinct_and_increasing() -> None:
    prof: Profiler[None] = Profiler(FakeClock())
    tokens = [prof.start() for _ in range(5)]
    assert [t.id for t in tokens] == [1, 2, 3, 4, 5]
    assert all(t in prof for t in tokens)
    assert [a.token for a in prof.active()] == tokens


def test_ending_twice_is_a_profile_error() -> None:
    prof: Profiler[None] = Profiler(FakeClock())
    token = prof.start()
    prof.end(token)
    with pytest.raises(ProfileError, match="already ended"):
        prof.end(token)
    assert token not in prof


@pytest.mark.parametrize("token_id", [0, 7, -1])
def test_unknown_token_is_a_profile_error(token_id: int) -> None:
    prof: Profiler[None] = Profiler(FakeClock())
    prof.start()
    with pytest.raises(ProfileError, match=f"unknown profiling token {token_id}"):
        prof.end(ProfilingToken(token_id))
    with pytest.raises(ProfileError):
        prof.get(ProfilingToken(token_id))
    assert len(prof) == 1


def test_payload_and_pop_for_device_timing() -> None:
    clock = FakeClock()
    prof: Profiler[str] = Profiler(clock)
    token = prof.start("start-event")
    active = prof.pop(token)
    assert (active.token, active.start_ns, active.payload) == (token, 1_000, "start-event")
    with pytest.raises(ProfileError, match="already ended"):
        prof.pop(token)


def test_clear_returns_active_profiles() -> None:
    prof: Profiler[None] = Profiler(FakeClock())
    a, b = prof.start(), prof.start()
    prof.end(a)
    assert [p.token for p in prof.clear()] == [b]
    assert len(prof) == 0
    with pytest.raises(ProfileError, match="already ended"):
        prof.end(b)


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 1000), st.integers(0, 50)), max_size=60))
def test_random_nesting_and_overlap_give_consistent_durations(
    ops: list[tuple[bool, int, int]],
) -> None:
    """Start or end profiles in any order: each duration is its own end minus its start,
    and a profile that encloses another lasts at least as long."""
    clock = FakeClock()
    prof: Profiler[None] = Profiler(clock)
    open_: list[tuple[ProfilingToken, int]] = []
    done: list[tuple[int, int, ProfileDuration]] = []
    for is_start, pick, step in ops:
        clock.advance(step)
        if is_start or not open_:
            open_.append((prof.start(), clock.now))
            continue
        token, started = open_.pop(pick % len(open_))
        duration = prof.end(token)
        assert (duration.start_ns, duration.end_ns) == (started, clock.now)
        done.append((started, clock.now, duration))
    for s1, e1, d1 in done:
        for s2, e2, d2 in done:
            if s1 <= s2 and e2 <= e1:
                assert d1.duration_ns >= d2.duration_ns
    assert len(prof) == len(open_)


# -- kernel records -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("level", "enabled", "device"),
    [
        (ProfilingLevel.DISABLED, False, False),
        (ProfilingLevel.BASIC, False, False),
        (ProfilingLevel.MEDIUM, True, False),
        (ProfilingLevel.FULL, True, True),
    ],
)
def test_recorder_levels(level: ProfilingLevel, enabled: bool, device: bool) -> None:
    rec = KernelRecorder.from_config(ProfilingConfig(level=level))
    assert (rec.enabled, rec.device_timing) == (enabled, device)
    rec.record("add", 1, "kernel", 0, 5, 9)
    assert len(rec) == (1 if enabled else 0)


def test_recorder_keeps_records_in_order() -> None:
    rec = KernelRecorder(ProfilingLevel.FULL)
    rec.record("add", 1, "kernel", 0, 10, 30)
    rec.record("read", 2, "copy", 5, 30, 35, nbytes=4096)
    rec.record("wait 1", 2, "wait", 30, 30, 31)
    got = rec.records()
    assert [r.name for r in got] == ["add", "read", "wait 1"]
    assert got[1] == KernelRecord("read", 2, "copy", 5, 30, 35, 4096)
    assert got[0].duration_ns == 20
    assert got[1].queue_delay_ns == 25
    assert list(rec) == got


def test_recorder_is_bounded_and_drains() -> None:
    rec = KernelRecorder(ProfilingLevel.MEDIUM, max_records=3)
    for i in range(5):
        rec.record(f"k{i}", 0, "kernel", i, i, i + 1)
    assert [r.name for r in rec.records()] == ["k2", "k3", "k4"]
    assert rec.dropped == 2
    assert len(rec.drain()) == 3
    assert len(rec) == 0
    rec.clear()
    assert rec.dropped == 0


def test_recorder_rejects_bad_kind_and_size() -> None:
    rec = KernelRecorder(ProfilingLevel.FULL)
    with pytest.raises(InvalidArgument, match="kernel, copy or wait"):
        rec.record("x", 0, "launch", 0, 0, 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        KernelRecorder(max_records=0)


def test_disabled_recorder_ignores_even_bad_records() -> None:
    rec = KernelRecorder(ProfilingLevel.DISABLED)
    rec.record("x", 0, "launch", 0, 0, 1)  # type: ignore[arg-type]
    assert len(rec) == 0


# -- summaries ------------------------------------------------------------------------------


def test_summary_aggregates_by_name() -> None:
    summary = ProfileSummary()
    summary.add("matmul", ProfileDuration(0, 300, TimingMethod.DEVICE))
    summary.add("matmul", 100)
    summary.add("matmul", 200)
    summary.add("add", 50)
    mm = summary["matmul"]
    assert (mm.count, mm.total_ns, mm.min_ns, mm.max_ns, mm.mean_ns) == (3, 600, 100, 300, 200.0)
    assert [s.name for s in summary] == ["matmul", "add"]  # by total, largest first
    assert "add" in summary
    assert len(summary) == 2


def test_summary_from_records_and_merge() -> None:
    rec = KernelRecorder(ProfilingLevel.FULL)
    rec.record("add", 0, "kernel", 0, 0, 10)
    rec.record("add", 1, "kernel", 0, 5, 25)
    a = rec.summary()
    assert a["add"].count == 2
    b = ProfileSummary([("add", 1), ("mul", 7)])
    merged = a.merge(b)
    assert (merged["add"].count, merged["add"].total_ns, merged["add"].min_ns) == (3, 31, 1)
    assert merged["mul"].max_ns == 7
    assert a["add"].count == 2  # inputs untouched


def test_summary_text_and_html() -> None:
    summary = ProfileSummary([("a<b>", 1_500), ("c", 2_000_000)])
    text = str(summary)
    assert text.splitlines()[0].split() == ["name", "count", "total", "mean", "min", "max"]
    assert "2.00 ms" in text
    page = summary._repr_html_()
    assert page == profile_summary_html(summary)
    assert "a&lt;b&gt;" in page
    assert "a<b>" not in page
    assert page.count("<tr>") == 3


@pytest.mark.parametrize(
    ("ns", "text"),
    [(850, "850 ns"), (12_345, "12.35 µs"), (3_200_000, "3.20 ms"), (1_234_000_000, "1.234 s")],
)
def test_format_ns(ns: int, text: str) -> None:
    assert format_ns(ns) == text
