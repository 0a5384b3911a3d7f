"""Per-task stream identity (cubecl's ``StreamId``, per task instead of per thread).

Tasks are asyncio's; under trio, the trio backend registers how to find the current
trio task (:func:`set_task_finder`), asked only where no asyncio loop runs.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final

import numpy as np

from ..errors import InvalidArgument

__all__ = ["StreamId", "current_task", "set_task_finder"]

MAX_STREAM_ID: Final = 2**63 - 1
"""The largest stream id: ids are non-negative and fit a signed 64-bit integer."""
_counter = itertools.count(1)
_owned: ContextVar[tuple[weakref.ReferenceType[object] | int, StreamId] | None] = ContextVar(
    "asynccube_stream_owned", default=None
)
_pinned: ContextVar[StreamId | None] = ContextVar("asynccube_stream_pinned", default=None)


_get_running_loop = asyncio._get_running_loop
_current_task = asyncio.current_task  # C on Python 3.12+


def _no_task() -> object | None:
    return None


_other_task: Callable[[], object | None] = _no_task


def set_task_finder(finder: Callable[[], object | None]) -> None:
    """Where no asyncio loop runs, ``finder()`` gives the current task of another
    library (trio's), or None in a plain thread."""
    global _other_task
    _other_task = finder


def current_task() -> object | None:
    """The calling asyncio (or trio) task, or None outside any task."""
    loop = _get_running_loop()
    return _other_task() if loop is None else _current_task(loop)


@dataclass(frozen=True, slots=True, order=True)
class StreamId:
    """Identifies a logical stream of work.

    Each asyncio (or trio) task gets its own stream the first time it asks (``StreamId.current()``),
    so concurrent tasks run on concurrent device streams. Code outside any task (a
    thread without a running loop) gets one stream per thread.
    """

    value: int

    def __str__(self) -> str:
        return f"StreamId({self.value})"

    @staticmethod
    def current() -> StreamId:
        """Return the stream of the calling task (or thread), minting one if needed."""
        pinned = _pinned.get()
        if pinned is not None:
            return pinned
        owned = _owned.get()
        loop = _get_running_loop()  # this is on every command: no helper frames
        task = _other_task() if loop is None else _current_task(loop)
        if owned is not None:
            owner = owned[0]
            if task is not None:
                if not isinstance(owner, int) and owner() is task:
                    return owned[1]
            elif owner == threading.get_ident():
                return owned[1]
        sid = StreamId(next(_counter))
        _owned.set((weakref.ref(task) if task is not None else threading.get_ident(), sid))
        return sid

    @staticmethod
    @contextmanager
    def pinned(stream: StreamId | int) -> Iterator[StreamId]:
        """Run the ``with`` block on an explicit stream.

        ``with StreamId.pinned(StreamId(7)):`` makes every call in the block, and in
        tasks it creates, use stream 7. Pins nest; leaving the block restores the
        previous one.
        """
        if isinstance(stream, StreamId):
            sid = stream
        elif isinstance(stream, int | np.integer) and not isinstance(stream, bool | np.bool_):
            sid = StreamId(int(stream))  # numpy integers are ordinary ints
        else:
            raise InvalidArgument(
                f"StreamId.pinned(stream): stream must be a StreamId or an int, got {stream!r}"
            )
        if not (type(sid.value) is int and 0 <= sid.value <= MAX_STREAM_ID):
            raise InvalidArgument(
                f"StreamId.pinned(stream): stream must be in [0, 2**63 - 1], got {sid.value!r}; "
                "pick a small non-negative number (streams share max_streams device "
                "streams by id modulo max_streams)"
            )
        token = _pinned.set(sid)
        try:
            yield sid
        finally:
            _pinned.reset(token)
