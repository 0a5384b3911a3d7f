"""The CUDA server's half of ``client.wait``/``after`` (:mod:`asynccube._core.cuda.foreign`)
against a fake driver, so its checks and its event bookkeeping run without a GPU: another
context, a handle the driver does not know, a capturing stream, an object declaring
another device; a stream's capture is an event of the pool recorded on it, an event's is
recorded on a fresh side stream that waits on it (destroyed at once); ``foreign_after``
gives the event back; a capture no command took goes back to the pool. The real driver
runs these paths in ``test_foreign_cuda.py``."""

from __future__ import annotations

import gc
from types import SimpleNamespace
from typing import Any

import pytest

import asynccube as ac
from asynccube._core.cuda import foreign as cuda_foreign
from asynccube._core.cuda.foreign import ForeignOps
from asynccube._core.server.foreign import ForeignWork

OURS, OTHER = 0xC0, 0xC1  # contexts
INVALID_HANDLE = 400
NOT_READY = 600


class Handle:
    def __init__(self, value: int) -> None:
        self.value = value

    def __int__(self) -> int:
        return self.value


class FakeDriver:
    """The few driver calls the module makes, with the state a test sets."""

    CUstream_flags = SimpleNamespace(CU_STREAM_NON_BLOCKING=1)
    CUstreamCaptureStatus = SimpleNamespace(CU_STREAM_CAPTURE_STATUS_NONE=0)

    def __init__(self) -> None:
        self.contexts: dict[int, int] = {}  # stream -> context; absent: destroyed
        self.capturing: set[int] = set()
        self.events: dict[int, int] = {}  # event -> query result; absent: destroyed
        self.calls: list[tuple[Any, ...]] = []
        self._next = 0x900

    def CUstream(self, value: int) -> Handle:
        return Handle(value)

    def CUevent(self, value: int) -> Handle:
        return Handle(value)

    def cuStreamCreate(self, flags: int) -> tuple[int, Handle]:
        self._next += 1
        self.calls.append(("create", self._next))
        return (0, Handle(self._next))

    def cuStreamDestroy(self, stream: Handle) -> tuple[int]:
        self.calls.append(("destroy", int(stream)))
        return (0,)


class FakeHot:
    def __init__(self, driver: FakeDriver) -> None:
        self.d = driver

    def event_query(self, event: Any) -> int:
        return self.d.events.get(int(event), INVALID_HANDLE)

    def stream_check(self, stream: Any) -> tuple[int, int, int, int]:
        ctx = self.d.contexts.get(int(stream))
        if ctx is None:
            return INVALID_HANDLE, 0, 0, 0
        return 0, ctx, 0, 1 if int(stream) in self.d.capturing else 0

    def stream_wait_event(self, stream: Any, event: Any) -> int:
        self.d.calls.append(("wait", int(stream), int(event)))
        return 0 if int(event) in self.d.events or int(event) < 0x100 else INVALID_HANDLE


class Pool:
    """The server's EventPool: events are small ints, recorded in ``calls``."""

    def __init__(self, driver: FakeDriver) -> None:
        self.d = driver
        self.free = [1, 2, 3]
        self.taken: list[int] = []

    def record(self, stream: Any) -> int:
        if int(stream) not in self.d.contexts and int(stream) > 2 and int(stream) < 0x900:
            raise ac.CudaDriverError(INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "gone")
        event = self.free.pop()
        self.taken.append(event)
        self.d.calls.append(("record", event, int(stream)))
        return event

    def give(self, event: int) -> None:
        self.taken.remove(event)
        self.free.append(event)


class Server(ForeignOps):
    def __init__(self, driver: FakeDriver) -> None:
        self._ctx = SimpleNamespace(ordinal=0, context=Handle(OURS), handle=OURS)  # type: ignore[assignment]
        self._events = Pool(driver)  # type: ignore[assignment]
        own = SimpleNamespace(stream=Handle(0x51))
        self._streams = SimpleNamespace(  # type: ignore[assignment]
            streams=SimpleNamespace(get=lambda s: own),
            resolve=lambda s, b: own,
        )

    def _completion(self, events: list[Any], stream: Any, finalize: Any) -> Any:
        return ("completion", list(events), int(stream))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> tuple[Server, FakeDriver]:
    driver = FakeDriver()
    monkeypatch.setattr(cuda_foreign, "cu", lambda: driver)
    monkeypatch.setattr(cuda_foreign, "hot", FakeHot(driver))
    return Server(driver), driver


def _work(kind: Any, handle: int, device: int | None = None) -> ForeignWork:
    return ForeignWork(kind, handle, "lib.Thing", "wait", device)


def test_a_stream_of_this_context_is_captured_by_an_event_on_it(
    fake: tuple[Server, FakeDriver],
) -> None:
    server, d = fake
    d.contexts[0x70] = OURS
    work = _work("stream", 0x70)
    server.capture_foreign(work)
    assert d.calls == [("record", 3, 0x70)]
    assert server.foreign_wait(work, None) == ("completion", [3], 0x51)  # type: ignore[arg-type]
    assert work.captured is None  # handed to the completion


@pytest.mark.parametrize("handle", [0, 1, 2])
def test_the_default_streams_are_not_asked_their_context(
    fake: tuple[Server, FakeDriver], handle: int
) -> None:
    server, d = fake
    work = _work("stream", handle)
    server.capture_foreign(work)
    assert d.calls == [("record", 3, handle)]


@pytest.mark.parametrize(
    ("setup", "work", "match"),
    [
        (lambda d: d.contexts.update({0x70: OTHER}), _work("stream", 0x70), "another device"),
        (lambda d: None, _work("stream", 0x71), "does not know that stream.*destroyed"),
        (
            lambda d: (d.contexts.update({0x72: OURS}), d.capturing.add(0x72)),
            _work("stream", 0x72),
            "capturing a CUDA graph",
        ),
        (lambda d: None, _work("event", 0xE9), "does not know that event"),
        (lambda d: None, _work("stream", 0x70, device=1), "belongs to cuda:1.*runs on cuda:0"),
    ],
    ids=["other context", "destroyed stream", "capturing", "destroyed event", "other device"],
)
def test_refusals_queue_nothing(
    fake: tuple[Server, FakeDriver], setup: Any, work: ForeignWork, match: str
) -> None:
    server, d = fake
    setup(d)
    with pytest.raises(ac.ForeignStreamError, match=match):
        server.capture_foreign(work)
    assert work.captured is None and server._events.free == [1, 2, 3]  # type: ignore[attr-defined]
    assert not [c for c in d.calls if c[0] == "record"]


def test_an_event_is_captured_on_a_side_stream_destroyed_at_once(
    fake: tuple[Server, FakeDriver],
) -> None:
    server, d = fake
    d.events[0xE1] = NOT_READY
    work = _work("event", 0xE1)
    server.capture_foreign(work)
    (_, side), *rest = d.calls
    assert rest == [("wait", side, 0xE1), ("record", 3, side), ("destroy", side)]
    never = _work("event", 0)  # never recorded: nothing captured, nothing to wait for
    server.capture_foreign(never)
    assert never.captured is None
    assert server.foreign_wait(never, None) == ("completion", [], 0x51)  # type: ignore[arg-type]


def test_after_waits_on_the_capture_and_gives_it_back(fake: tuple[Server, FakeDriver]) -> None:
    server, d = fake
    d.contexts[0x70] = OURS
    work = _work("stream", 0x70)
    server.capture_foreign(work)
    server.foreign_after(work, None)  # type: ignore[arg-type]
    assert d.calls[-1] == ("wait", 0x51, 3)  # the task's stream waits for the capture
    assert server._events.free == [1, 2, 3]  # type: ignore[attr-defined]


def test_a_capture_no_command_took_goes_back(fake: tuple[Server, FakeDriver]) -> None:
    server, d = fake
    d.contexts[0x70] = OURS
    work = _work("stream", 0x70)
    server.capture_foreign(work)
    assert server._events.taken == [3]  # type: ignore[attr-defined]
    del work
    gc.collect()
    assert server._events.taken == []  # type: ignore[attr-defined]


def test_foreign_done_gives_back_a_capture_done_within_the_spin(
    fake: tuple[Server, FakeDriver],
) -> None:
    """Issue 38: ``client.wait``'s one-call route (``FastSync.foreign``) asks this."""
    server, d = fake
    d.contexts[0x70] = OURS
    d.events[3] = 0  # the capture (the pool's event 3) is done
    work = _work("stream", 0x70)
    server.capture_foreign(work)
    assert server.foreign_done(work, 30e-6) == 0
    assert work.captured is None and server._events.free == [1, 2, 3]  # type: ignore[attr-defined]
    never = _work("event", 0)  # nothing captured: nothing to wait for
    server.capture_foreign(never)
    assert server.foreign_done(never, 30e-6) == 0


@pytest.mark.parametrize("status", [NOT_READY, INVALID_HANDLE], ids=["not done", "error"])
def test_foreign_done_leaves_a_capture_not_done_or_in_error_to_the_route(
    fake: tuple[Server, FakeDriver], status: int
) -> None:
    server, d = fake
    d.contexts[0x70] = OURS
    d.events[3] = status
    work = _work("stream", 0x70)
    server.capture_foreign(work)
    assert server.foreign_done(work, 30e-6) == status
    assert work.captured == 3 and server._events.taken == [3]  # type: ignore[attr-defined]
    assert server.foreign_wait(work, None) == ("completion", [3], 0x51)  # type: ignore[arg-type]
