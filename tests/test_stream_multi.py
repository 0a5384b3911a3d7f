"""MultiStream (seed ``stream_event.rs``) and StreamPool, against a recording backend."""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field

import pytest

from asynccube._core.config.config import LogLevel
from asynccube._core.config.logging import ServerLogger
from asynccube._core.errors import InvalidArgument
from asynccube._core.stream.multi import MultiStream, SharedBindingAnalysis
from asynccube._core.stream.pool import StreamPool
from asynccube._core.values.slices import ReleaseQueue, SliceHandle
from asynccube._core.values.stream_id import StreamId
from asynccube._core.values.types import Binding, Handle

MAX_STREAMS = 4

_queue = ReleaseQueue(owner_id=-1)
_ids = itertools.count(1)


def binding(stream: StreamId, cursor: int = 0) -> Binding:
    """A binding over a fresh slice created on ``stream`` at ``cursor`` (seed: ``binding``)."""
    return Handle(SliceHandle(next(_ids), _queue), None, None, stream, cursor, 10).binding()


@dataclass(eq=False)
class TestStream:
    """Records what the backend did to it."""

    __test__ = False
    name: int
    ops: list[tuple[str, int]] = field(default_factory=list)


@dataclass(frozen=True)
class TestEvent:
    """An event flushed from stream ``origin`` after ``ops_before`` operations."""

    __test__ = False
    origin: int
    ops_before: int


class TestBackend:
    """The seed's TestBackend, recording flushes and waits."""

    __test__ = False

    def __init__(self) -> None:
        self.created: list[TestStream] = []
        self.flushes = 0
        self.waits: list[tuple[int, TestEvent]] = []

    def create_stream(self) -> TestStream:
        stream = TestStream(len(self.created))
        self.created.append(stream)
        return stream

    def flush(self, stream: TestStream) -> TestEvent:
        self.flushes += 1
        stream.ops.append(("flush", self.flushes))
        return TestEvent(stream.name, len(stream.ops))

    def wait_event(self, stream: TestStream, event: TestEvent) -> None:
        self.waits.append((stream.name, event))
        stream.ops.append(("wait", event.origin))

    def wait_event_sync(self, event: TestEvent) -> None:
        return None


def multi_stream(
    max_streams: int = MAX_STREAMS, logger: ServerLogger | None = None
) -> tuple[MultiStream[TestStream, TestEvent], TestBackend]:
    backend = TestBackend()
    return MultiStream(backend, max_streams, logger or ServerLogger()), backend


S1, S2, S3 = StreamId(1), StreamId(2), StreamId(3)


# -- the seed's four tests ---------------------------------------------------------------


def test_analysis_shared_bindings_1() -> None:
    binding_1, binding_2 = binding(S1), binding(S2)
    ms, _ = multi_stream()
    ms.resolve(S1, [])
    ms.resolve(S2, [])

    analysis = ms.update_shared_bindings(S1, [binding_1, binding_2])

    expected = SharedBindingAnalysis()
    expected.shared(binding_2.memory.id, ms.streams.stream_index(binding_2.stream))
    assert analysis == expected


def test_analysis_shared_bindings_2() -> None:
    binding_1, binding_2, binding_3 = binding(S1), binding(S2), binding(S1)
    ms, _ = multi_stream()
    ms.resolve(S1, [])
    ms.resolve(S2, [])

    analysis = ms.update_shared_bindings(S1, [binding_1, binding_2, binding_3])

    expected = SharedBindingAnalysis()
    expected.shared(binding_2.memory.id, ms.streams.stream_index(binding_2.stream))
    assert analysis == expected


def test_analysis_no_shared() -> None:
    bindings = [binding(S1), binding(S1), binding(S1)]
    ms, _ = multi_stream()
    ms.resolve(S1, [])
    ms.resolve(S2, [])

    analysis = ms.update_shared_bindings(S1, bindings)

    assert analysis == SharedBindingAnalysis()


def test_state() -> None:
    binding_1, binding_2, binding_3 = binding(S1), binding(S2), binding(S1)
    ms, _ = multi_stream()
    ms.resolve(S1, [])
    ms.resolve(S2, [])

    ms.resolve(S1, [binding_1, binding_2, binding_3])

    stream1 = ms.streams.get(S1)
    index_2 = S2.value % MAX_STREAMS
    assert stream1.last_synced.get(index_2) == 1
    assert stream1.cursor == 2

    stream2 = ms.streams.get(S2)
    assert stream2.last_synced == {}
    assert stream2.cursor == 1


# -- resolve: events, cursors ------------------------------------------------------------


def test_resolve_flushes_the_origin_and_waits_on_its_event() -> None:
    ms, backend = multi_stream()
    b2 = binding(S2)
    ms.resolve(S2, [])
    resolved = ms.resolve(S1, [b2])
    s1, s2 = ms.streams.get(S1).stream, ms.streams.get(S2).stream
    assert s2.ops == [("flush", 1)]
    assert backend.waits == [(s1.name, TestEvent(s2.name, 1))]
    assert resolved.stream is s1
    assert resolved.current == S1
    assert resolved.cursor == 1
    assert list(resolved.analysis.slices) == [ms.stream_index(S2)]


def test_already_synced_bindings_need_no_wait() -> None:
    ms, backend = multi_stream()
    b2 = binding(S2)
    ms.resolve(S2, [b2])
    ms.resolve(S1, [b2])
    ms.resolve(S1, [b2])
    assert len(backend.waits) == 1


def test_new_work_on_the_origin_needs_a_new_wait() -> None:
    ms, backend = multi_stream()
    b2 = binding(S2)
    ms.resolve(S2, [b2])
    ms.resolve(S1, [b2])
    ms.resolve(S2, [b2])  # S2 uses the slice again (after S1): S2 waits on S1
    ms.resolve(S1, [b2])  # ... and now S1 must wait on S2's new work
    s1, s2 = ms.streams.get(S1).stream.name, ms.streams.get(S2).stream.name
    assert [(w, e.origin) for w, e in backend.waits] == [(s1, s2), (s2, s1), (s1, s2)]
    assert ms.streams.get(S1).last_synced[ms.stream_index(S2)] == 2


def test_one_wait_per_origin_stream() -> None:
    ms, backend = multi_stream()
    ms.resolve(S2, [])
    ms.resolve(S1, [binding(S2), binding(S2), binding(S2)])
    assert len(backend.waits) == 1
    (origin_slices,) = ms.update_shared_bindings(S3, [binding(S2), binding(S2)]).slices.values()
    assert len(origin_slices) == 2


def test_streams_in_the_same_slot_never_wait_on_each_other() -> None:
    ms, backend = multi_stream(max_streams=2)
    b1 = binding(S1)
    ms.resolve(S1, [b1])
    ms.resolve(S3, [b1])  # 3 mod 2 == 1 mod 2: the same backend stream
    assert backend.waits == []
    assert len(backend.created) == 1


# -- last-use tracking (one step beyond the seed) -----------------------------------------


def test_origin_is_the_last_use_not_the_creator() -> None:
    ms, backend = multi_stream()
    x = binding(S1)
    ms.resolve(S1, [x])
    ms.resolve(S3, [x])  # written in place on stream 3
    assert ms.origin(x) == (S3, 1)

    analysis = ms.update_shared_bindings(S2, [x])
    assert analysis.slices == {ms.stream_index(S3): [x.memory.id]}

    backend.waits.clear()
    ms.resolve(S2, [x])
    s3 = ms.streams.get(S3).stream
    assert [e.origin for _, e in backend.waits] == [s3.name]
    assert ms.streams.get(S2).last_synced == {ms.stream_index(S3): 1}


def test_binding_back_on_its_creator_waits_on_the_last_user() -> None:
    ms, backend = multi_stream()
    x = binding(S1)
    ms.resolve(S1, [x])
    ms.resolve(S3, [x])
    backend.waits.clear()
    ms.resolve(S1, [x])  # S3 may still be writing x: S1 must wait on S3
    s1, s3 = ms.streams.get(S1).stream, ms.streams.get(S3).stream
    assert [(w, e.origin) for w, e in backend.waits] == [(s1.name, s3.name)]


def test_last_use_is_stamped_with_the_new_cursor() -> None:
    ms, _ = multi_stream()
    x, y = binding(S1), binding(S1)
    ms.resolve(S2, [])
    resolved = ms.resolve(S2, [x, y])
    assert resolved.cursor == 2
    assert ms.origin(x) == ms.origin(y) == (S2, 2)
    assert ms.last_use[x.memory.id] == (S2, 2)


def test_a_never_used_binding_comes_from_its_handle() -> None:
    ms, _ = multi_stream()
    x = binding(S3, cursor=7)
    assert ms.origin(x) == (S3, 7)
    ms.resolve(S3, [])
    ms.resolve(S1, [x])
    assert ms.streams.get(S1).last_synced == {ms.stream_index(S3): 1}
    # Synced only up to cursor 1 of stream 3, but the handle says cursor 7: still shared.
    y = binding(S3, cursor=7)
    assert ms.update_shared_bindings(S1, [y]).slices == {ms.stream_index(S3): [y.memory.id]}


# -- helpers of the server ------------------------------------------------------------------


def test_flush_all_and_existing_streams() -> None:
    ms, backend = multi_stream()
    ms.resolve(S1, [])
    ms.resolve(S2, [])
    assert [e.origin for e in ms.flush_all()] == [0, 1]
    gc = ms.gc_stream()
    assert ms.existing_streams() == [*backend.created[:2], gc]


def test_a_shared_binding_after_own_ones_still_waits() -> None:
    """The same-stream fast path stops at the first foreign origin and waits on it."""
    ms, backend = multi_stream()
    own, other = binding(S1), binding(S2)
    ms.resolve(S2, [other])
    ms.resolve(S1, [own, own, other])
    assert [(stream, event.origin) for stream, event in backend.waits] == [(1, 0)]
    assert ms.origin(own) == ms.origin(other) == (S1, 1)


def test_existing_streams_are_in_slot_order_whatever_the_creation_order() -> None:
    ms, backend = multi_stream()
    ms.resolve(S3, [])
    ms.resolve(S1, [])
    assert [e.origin for e in ms.flush_all()] == [1, 0]  # slot 1 (S1) first, then S3
    assert ms.existing_streams()[:2] == [backend.created[1], backend.created[0]]


def test_advance_is_resolve_without_bindings() -> None:
    ms, backend = multi_stream()
    assert ms.advance(S1) == 1
    assert ms.resolve(S1, ()).cursor == 2
    assert ms.advance(S1) == 3
    assert backend.waits == [] and len(backend.created) == 1


def test_flush_pending_skips_streams_known_complete() -> None:
    """A sync flushes only streams with work since the last sync seen complete."""
    ms, _ = multi_stream()
    ms.resolve(S1, [])
    ms.resolve(S2, [])
    events, marks = ms.flush_pending()
    assert [e.origin for e in events] == [0, 1]
    again, _ = ms.flush_pending()  # not marked done yet: flushed again
    assert [e.origin for e in again] == [0, 1]
    ms.mark_done(marks)
    assert ms.flush_pending() == ([], [])
    ms.resolve(S2, [])
    events, marks = ms.flush_pending()
    assert [e.origin for e in events] == [1]
    ms.mark_done([(marks[0][0], 0)])  # an older mark never moves "done" back
    assert [e.origin for e in ms.flush_pending()[0]] == [1]


# -- streaming logs -------------------------------------------------------------------------


def _streaming_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "asynccube.streaming"]


def _built(built: list[LogLevel], level: LogLevel) -> str:
    built.append(level)
    return f"message at {level.name}"


def _cross_stream(logger: ServerLogger) -> None:
    ms, _ = multi_stream(logger=logger)
    b2 = binding(S2)
    ms.resolve(S2, [b2])
    ms.resolve(S1, [b2])


def test_basic_logs_the_cross_stream_wait(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="asynccube.streaming")
    _cross_stream(ServerLogger(streaming=LogLevel.BASIC))
    records = _streaming_records(caplog)
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.INFO, f"Waiting on {S2.value % MAX_STREAMS} from {S1}")
    ]


def test_full_logs_each_shared_binding(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="asynccube.streaming")
    _cross_stream(ServerLogger(streaming=LogLevel.FULL))
    records = _streaming_records(caplog)
    assert [r.levelno for r in records] == [logging.DEBUG, logging.INFO]
    assert "is shared on StreamId(1) since it was never synced" in records[0].getMessage()
    assert records[1].getMessage().startswith("Waiting on")


def test_disabled_logs_nothing_and_formats_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="asynccube.streaming")
    logger = ServerLogger()
    _cross_stream(logger)
    built: list[LogLevel] = []
    logger.log_streaming(LogLevel.BASIC, lambda: _built(built, LogLevel.BASIC))
    logger.log_streaming(LogLevel.FULL, lambda: _built(built, LogLevel.FULL))
    assert _streaming_records(caplog) == []
    assert built == []


def test_basic_does_not_format_full_messages() -> None:
    built: list[LogLevel] = []
    ServerLogger(streaming=LogLevel.BASIC).log_streaming(
        LogLevel.FULL, lambda: _built(built, LogLevel.FULL)
    )
    assert built == []


# -- StreamPool -----------------------------------------------------------------------------


class CountingFactory:
    def __init__(self) -> None:
        self.made = 0

    def create(self) -> int:
        self.made += 1
        return self.made


def test_pool_index_is_id_mod_max_streams() -> None:
    pool: StreamPool[int] = StreamPool(CountingFactory(), 4, 1)
    assert [pool.stream_index(StreamId(v)) for v in (0, 1, 4, 5, 7, 1027)] == [0, 1, 0, 1, 3, 3]
    assert pool.get(StreamId(5)) is pool.get(StreamId(1))


def test_pool_creates_streams_lazily() -> None:
    factory = CountingFactory()
    pool: StreamPool[int] = StreamPool(factory, 4, 1)
    assert factory.made == 0
    assert pool.existing() == []
    first = pool.get(StreamId(2))
    assert factory.made == 1
    assert pool.get(StreamId(6)) == first
    assert factory.made == 1
    assert pool.existing() == [(2, first)]


def test_pool_is_bounded_by_max_streams() -> None:
    factory = CountingFactory()
    pool: StreamPool[int] = StreamPool(factory, 3, 1)
    for value in range(1000):
        pool.get(StreamId(value))
    assert factory.made == 3
    assert [i for i, _ in pool.existing()] == [0, 1, 2]


def test_pool_special_slots_sit_after_the_regular_ones() -> None:
    factory = CountingFactory()
    pool: StreamPool[int] = StreamPool(factory, 2, 2)
    gc = pool.get_special(0)
    other = pool.get_special(1)
    assert gc != other
    assert pool.get_index(2) == gc
    assert pool.get_index(3) == other
    assert pool.existing() == [(2, gc), (3, other)]
    assert gc not in (pool.get(StreamId(0)), pool.get(StreamId(1)))
    with pytest.raises(IndexError):
        pool.get_special(2)


def test_multistream_has_one_special_gc_stream() -> None:
    ms, backend = multi_stream(max_streams=2)
    gc = ms.gc_stream()
    assert ms.gc_stream() is gc
    assert gc not in (ms.streams.get(S1).stream, ms.streams.get(S2).stream)
    assert len(backend.created) == 3


@pytest.mark.parametrize("bad", [0, -1, 1025])
def test_pool_rejects_bad_max_streams(bad: int) -> None:
    with pytest.raises(InvalidArgument, match="max_streams"):
        StreamPool(CountingFactory(), bad, 1)
