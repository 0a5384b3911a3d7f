"""The CUDA server's Retirer (``cuda/streams.py``) without a GPU: objects parked per
stream are dropped once the event after them is reached, and a poll visits only the
streams with groups still in flight (it runs for every copy)."""

from __future__ import annotations

from typing import Any

import pytest

from asynccube._core.cuda import streams

_NOT_READY = 600  # CUDA_ERROR_NOT_READY


class _Events:
    """EventPool's record/give, with events that are ints; ``done`` the reached ones."""

    def __init__(self) -> None:
        self.next = 0
        self.done: set[int] = set()
        self.given: list[int] = []
        self.queries = 0

    def record(self, stream: Any) -> int:
        self.next += 1
        return self.next

    def give(self, event: int) -> None:
        self.given.append(event)

    def event_query(self, event: int) -> int:
        self.queries += 1
        return 0 if event in self.done else _NOT_READY


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> _Events:
    fake = _Events()
    monkeypatch.setattr(streams, "hot", fake)
    return fake


def test_parked_objects_go_once_their_event_is_reached(events: _Events) -> None:
    retirer = streams.Retirer(events)  # type: ignore[arg-type]
    held = {s: [s * 10] for s in (1, 2, 3)}
    for s, objs in held.items():
        retirer.hold(s, objs)
    retirer.seal()  # events 1, 2, 3 after streams 1, 2, 3
    assert retirer.poll() == 3
    events.done.add(2)
    assert retirer.poll() == 2
    assert events.given == [2]
    events.done.update({1, 3})
    assert retirer.poll() == 0
    assert sorted(events.given) == [1, 2, 3]


def test_a_poll_visits_only_streams_with_work_in_flight(events: _Events) -> None:
    retirer = streams.Retirer(events)  # type: ignore[arg-type]
    for s in range(32):  # every stream of the pool was used once
        retirer.hold(s, object())
    retirer.seal()
    events.done.update(range(1, 33))
    assert retirer.poll() == 0
    retirer.hold(7, object())
    retirer.seal()
    before = events.queries
    assert retirer.poll() == 1
    assert events.queries - before == 1
    assert list(retirer._inflight) == [7]  # the 31 passed streams are not visited again
    before = events.queries
    events.done.add(33)
    assert retirer.poll() == 0 and retirer.poll() == 0
    assert events.queries - before == 1 and not retirer._inflight  # nothing to visit
