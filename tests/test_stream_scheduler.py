"""SchedulerMultiStream (seed ``stream/scheduler.rs``), against a recording backend."""

from __future__ import annotations

import itertools
import logging

import pytest

from asynccube._core.config.config import LogLevel
from asynccube._core.config.logging import ServerLogger
from asynccube._core.errors import InvalidArgument
from asynccube._core.stream.scheduler import (
    SchedulerMultiStream,
    SchedulerMultiStreamOptions,
    SchedulerStrategy,
)
from asynccube._core.values.slices import ReleaseQueue, SliceHandle
from asynccube._core.values.stream_id import StreamId
from asynccube._core.values.types import Binding, Handle

INTERLEAVE = SchedulerStrategy.INTERLEAVE
SEQUENTIAL = SchedulerStrategy.SEQUENTIAL
S1, S2, S3, S4 = StreamId(1), StreamId(2), StreamId(3), StreamId(4)

_queue = ReleaseQueue(owner_id=-2)
_ids = itertools.count(1)


def binding(stream: StreamId) -> Binding:
    return Handle(SliceHandle(next(_ids), _queue), None, None, stream, 0, 10).binding()


class Recorder:
    """A SchedulerStreamBackend logging every enqueue and flush (streams are names,
    handed out in creation order)."""

    def __init__(self, names: list[str]) -> None:
        self.log: list[tuple[str, ...]] = []
        self._names = iter(names)

    def enqueue(self, task: str, stream: str) -> None:
        self.log.append(("enqueue", stream, task))

    def flush(self, stream: str) -> None:
        self.log.append(("flush", stream))

    def factory(self) -> Recorder:
        return self

    def create(self) -> str:
        return next(self._names)

    def take(self) -> list[tuple[str, ...]]:
        log, self.log = self.log, []
        return log


def scheduler(
    strategy: SchedulerStrategy,
    *,
    max_tasks: int = 100,
    max_streams: int = 8,
    track_last_use: bool = True,
    logger: ServerLogger | None = None,
) -> tuple[SchedulerMultiStream[str, str], Recorder]:
    """A scheduler whose streams are created up front: stream ``Sn`` is named ``"sn"``
    (with fewer slots, a slot is named after the first of S1..S4 that maps to it)."""
    backend = Recorder(["s1", "s2", "s3", "s4"])
    options = SchedulerMultiStreamOptions(max_streams, max_tasks, strategy, track_last_use)
    ms = SchedulerMultiStream(backend, options, logger)
    for stream in (S1, S2, S3, S4):
        if ms.pool.stream_index(stream) not in dict(ms.pool.existing()):
            ms.stream(stream)
    return ms, backend


def fill(ms: SchedulerMultiStream[str, str], stream: StreamId, *tasks: str) -> None:
    for task in tasks:
        ms.register(stream, task, [])


def enq(stream: str, *tasks: str) -> list[tuple[str, ...]]:
    return [("enqueue", stream, t) for t in tasks]


# -- buffering and max_tasks -----------------------------------------------------------------


@pytest.mark.parametrize("strategy", [INTERLEAVE, SEQUENTIAL])
def test_tasks_are_buffered_until_max_tasks(strategy: SchedulerStrategy) -> None:
    ms, rec = scheduler(strategy, max_tasks=3)
    fill(ms, S1, "a1", "a2")
    assert rec.take() == []
    fill(ms, S1, "a3")
    assert rec.take() == [*enq("s1", "a1", "a2", "a3"), ("flush", "s1")]
    fill(ms, S1, "a4", "a5")
    assert rec.take() == []
    fill(ms, S1, "a6")
    assert rec.take() == [*enq("s1", "a4", "a5", "a6"), ("flush", "s1")]


@pytest.mark.parametrize("strategy", [INTERLEAVE, SEQUENTIAL])
def test_max_tasks_counts_per_stream(strategy: SchedulerStrategy) -> None:
    ms, rec = scheduler(strategy, max_tasks=2)
    ms.register(S1, "a1", [])
    ms.register(S2, "b1", [])
    assert rec.take() == []
    ms.register(S2, "b2", [])
    assert rec.take() == [*enq("s2", "b1", "b2"), ("flush", "s2")]
    ms.register(S1, "a2", [])
    assert rec.take() == [*enq("s1", "a1", "a2"), ("flush", "s1")]


@pytest.mark.parametrize("strategy", [INTERLEAVE, SEQUENTIAL])
def test_max_tasks_one_executes_at_once(strategy: SchedulerStrategy) -> None:
    ms, rec = scheduler(strategy, max_tasks=1)
    fill(ms, S1, "a1", "a2")
    assert rec.take() == [*enq("s1", "a1"), ("flush", "s1"), *enq("s1", "a2"), ("flush", "s1")]


# -- strategies ------------------------------------------------------------------------------


def test_sequential_runs_each_stream_in_turn() -> None:
    ms, rec = scheduler(SEQUENTIAL)
    fill(ms, S1, "a1", "a2", "a3")
    fill(ms, S2, "b1")
    fill(ms, S3, "c1", "c2")
    ms.execute_streams([S2, S1, S3])
    assert rec.take() == [
        *enq("s2", "b1"),
        ("flush", "s2"),
        *enq("s1", "a1", "a2", "a3"),
        ("flush", "s1"),
        *enq("s3", "c1", "c2"),
        ("flush", "s3"),
    ]


def test_interleave_round_robins_on_the_first_stream() -> None:
    ms, rec = scheduler(INTERLEAVE)
    fill(ms, S1, "a1", "a2", "a3")
    fill(ms, S2, "b1")
    fill(ms, S3, "c1", "c2")
    ms.execute_streams([S1, S2, S3])
    assert rec.take() == [
        ("flush", "s2"),
        ("flush", "s3"),
        *enq("s1", "a1", "b1", "c1", "a2", "c2", "a3"),
        ("flush", "s1"),
    ]


def test_interleave_executes_on_the_first_stream_named() -> None:
    ms, rec = scheduler(INTERLEAVE)
    fill(ms, S1, "a1", "a2")
    fill(ms, S2, "b1", "b2")
    ms.execute_streams([S2, S1])
    assert rec.take() == [("flush", "s1"), *enq("s2", "b1", "a1", "b2", "a2"), ("flush", "s2")]


@pytest.mark.parametrize("strategy", [INTERLEAVE, SEQUENTIAL])
def test_execute_streams_takes_each_slot_once(strategy: SchedulerStrategy) -> None:
    ms, rec = scheduler(strategy, max_streams=2)
    fill(ms, S1, "a1", "a2")
    ms.execute_streams([S1, S3, S1])  # 3 mod 2 == 1: the same slot
    assert rec.take() == [*enq("s1", "a1", "a2"), ("flush", "s1")]


@pytest.mark.parametrize("strategy", [INTERLEAVE, SEQUENTIAL])
def test_execute_nothing(strategy: SchedulerStrategy) -> None:
    ms, rec = scheduler(strategy)
    ms.execute_streams([])
    assert rec.take() == []


@pytest.mark.parametrize("strategy", [INTERLEAVE, SEQUENTIAL])
def test_an_empty_stream_is_still_flushed(strategy: SchedulerStrategy) -> None:
    ms, rec = scheduler(strategy)
    ms.execute_streams([S1])
    assert rec.take() == [("flush", "s1")]


# -- streams holding shared bindings are executed first ---------------------------------------


def test_sequential_flushes_the_shared_stream_before_registering() -> None:
    ms, rec = scheduler(SEQUENTIAL)
    x = binding(S2)
    ms.register(S2, "b1", [x])
    ms.register(S2, "b2", [])
    ms.register(S1, "a0", [])
    assert rec.take() == []
    ms.register(S1, "a1", [x])
    assert rec.take() == [*enq("s2", "b1", "b2"), ("flush", "s2")]
    ms.execute_streams([S1])
    assert rec.take() == [*enq("s1", "a0", "a1"), ("flush", "s1")]


def test_interleave_flushes_every_shared_stream_first() -> None:
    ms, rec = scheduler(INTERLEAVE)
    x, y = binding(S2), binding(S3)
    ms.register(S2, "b1", [x])
    ms.register(S3, "c1", [y])
    ms.register(S3, "c2", [])
    ms.register(S1, "a1", [y, x, y])
    assert rec.take() == [("flush", "s2"), *enq("s3", "c1", "b1", "c2"), ("flush", "s3")]
    ms.execute_streams([S1])
    assert rec.take() == [*enq("s1", "a1"), ("flush", "s1")]


@pytest.mark.parametrize("strategy", [INTERLEAVE, SEQUENTIAL])
def test_own_bindings_flush_nothing(strategy: SchedulerStrategy) -> None:
    ms, rec = scheduler(strategy, max_streams=2)
    x, y = binding(S1), binding(S3)  # S3 shares S1's slot
    ms.register(S2, "b1", [])
    ms.register(S1, "a1", [x, y])
    assert rec.take() == []


@pytest.mark.parametrize("strategy", [INTERLEAVE, SEQUENTIAL])
def test_shared_flush_then_max_tasks(strategy: SchedulerStrategy) -> None:
    ms, rec = scheduler(strategy, max_tasks=2)
    x = binding(S2)
    ms.register(S2, "b1", [x])
    ms.register(S1, "a1", [])
    ms.register(S1, "a2", [x])
    assert rec.take() == [
        *enq("s2", "b1"),
        ("flush", "s2"),
        *enq("s1", "a1", "a2"),
        ("flush", "s1"),
    ]


def test_the_seed_ties_a_binding_to_its_creator_only() -> None:
    ms, rec = scheduler(SEQUENTIAL, track_last_use=False)
    x = binding(S3)
    ms.register(S2, "b1", [x])  # flushes S3 (the creator)
    assert rec.take() == [("flush", "s3")]
    ms.register(S1, "a1", [x])  # b1 (on S2) uses x, but the seed flushes S3 again
    assert rec.take() == [("flush", "s3")]


def test_last_use_flushes_the_stream_that_used_the_binding() -> None:
    ms, rec = scheduler(SEQUENTIAL)
    x = binding(S3)
    ms.register(S2, "b1", [x])  # flushes S3 (the creator); S2 is now x's last user
    assert rec.take() == [("flush", "s3")]
    ms.register(S1, "a1", [x])  # b1 may write x: S2 goes first
    assert rec.take() == [*enq("s2", "b1"), ("flush", "s2")]
    ms.register(S3, "c1", [x])  # back on the creator: a1 (S1) goes first
    assert rec.take() == [*enq("s1", "a1"), ("flush", "s1")]
    ms.register(S3, "c2", [x])  # S3 used it last: nothing to flush
    assert rec.take() == []
    ms.forget(x.memory.id)
    assert ms.origin(x) == S3


def test_stream_gives_the_backend_stream() -> None:
    ms, _ = scheduler(INTERLEAVE, max_streams=2)
    assert [ms.stream(s) for s in (S1, S2, S3, S4)] == ["s1", "s2", "s1", "s2"]


# -- logs --------------------------------------------------------------------------------------


def _shared_registration(level: LogLevel) -> None:
    ms, _ = scheduler(INTERLEAVE, logger=ServerLogger(streaming=level))
    x = binding(S2)
    ms.register(S2, "b1", [x])
    ms.register(S1, "a1", [x])


def _records(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "asynccube.streaming"]


def test_basic_logs_the_flush(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="asynccube.streaming")
    _shared_registration(LogLevel.BASIC)
    assert _records(caplog) == [
        (
            logging.INFO,
            "Flushing streams ['StreamId(2)'] before registering more tasks on StreamId(1)",
        )
    ]


def test_full_logs_the_shared_binding(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="asynccube.streaming")
    _shared_registration(LogLevel.FULL)
    records = _records(caplog)
    assert records[0] == (logging.DEBUG, "Binding on StreamId(2) is shared on StreamId(1)")
    assert [level for level, _ in records] == [logging.DEBUG, logging.INFO]


def test_disabled_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="asynccube.streaming")
    _shared_registration(LogLevel.DISABLED)
    assert _records(caplog) == []


# -- options -----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -3])
def test_options_reject_bad_max_tasks(bad: int) -> None:
    with pytest.raises(InvalidArgument, match="max_tasks"):
        SchedulerMultiStreamOptions(4, bad, INTERLEAVE)


def test_options_reject_bad_strategy() -> None:
    with pytest.raises(InvalidArgument, match="strategy"):
        SchedulerMultiStreamOptions(4, 8, "interleave")  # type: ignore[arg-type]


def test_options_reject_bad_max_streams() -> None:
    with pytest.raises(InvalidArgument, match="max_streams"):
        scheduler(INTERLEAVE, max_streams=0)
