"""The step timing of the lag probe and of ``ac.LoopMonitor`` (``lagprobe.attach_steps``:
``asyncio.events.Handle._run`` wrapped) keeps nothing of the step it timed.

From Python 3.12 a coroutine that ends during a loop step keeps the frames below it
(``f_back``: the wrapper's among them) for as long as its own frame is kept, by the
traceback of an error it raised, say. A wrapper frame that still held the handle kept the
handle's arguments: the future whose error that is, whose traceback holds the frame, a
cycle only the collector breaks, and with it every buffer those frames hold (a request
that failed in a helper coroutine kept its handles until a collection: issue 37, point 9,
seen on CUDA with Python 3.12). The first test holds the wrapper's frame as such a
traceback does, on any Python; the second is the whole chain, on 3.12 and later.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import weakref
from collections.abc import Callable, Coroutine, Iterator
from types import FrameType
from typing import Any

import pytest

from _asynccube_pytest import lagprobe


class _Sink:
    """A step sink that records nothing (the wrapper's own frame is under test)."""

    def begin(self) -> None:
        return None

    def end(self, step: Any, mark: Any) -> None:
        return None


class _Payload:
    """Stands for a buffer a frame holds (weakly referenceable)."""


@pytest.fixture
def no_gc() -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _timed(main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run ``main()`` on a new loop whose steps are timed."""

    async def run() -> Any:
        loop = asyncio.get_running_loop()
        sink = _Sink()
        lagprobe.attach_steps(loop, sink)
        try:
            return await main()
        finally:
            lagprobe.detach_steps(loop, sink)

    return asyncio.run(run())


@pytest.mark.usefixtures("no_gc")
def test_the_timed_step_frame_keeps_no_handle() -> None:
    kept: list[FrameType | None] = []

    def callback(payload: _Payload) -> None:
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code is not lagprobe._timed_run.__code__:
            frame = frame.f_back
        kept.append(frame)  # as a traceback's frames keep their f_back on Python 3.12

    async def main() -> weakref.ref[_Payload]:
        payload = _Payload()
        ref = weakref.ref(payload)
        asyncio.get_running_loop().call_soon(callback, payload)
        del payload
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return ref

    ref = _timed(main)
    assert kept and kept[0] is not None, "the callback ran under the timing wrapper"
    assert ref() is None, "the wrapper's frame kept the handle, and the handle its arguments"


@pytest.mark.skipif(sys.version_info < (3, 12), reason="frames keep their f_back from 3.12")
@pytest.mark.usefixtures("no_gc")
def test_an_error_caught_from_a_helper_keeps_its_frames_free() -> None:
    refs: list[weakref.ref[_Payload]] = []

    async def helper(box: list[asyncio.Future[None]]) -> None:
        payload = _Payload()  # a buffer of the helper's, in its frame
        refs.append(weakref.ref(payload))
        await box.pop()  # no frame of the chain holds the future, as with a client's

    async def handler(box: list[asyncio.Future[None]]) -> str:
        try:
            await helper(box)
        except ValueError:
            return "caught"
        return "no error"

    async def main() -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        task = loop.create_task(handler([fut]))
        await asyncio.sleep(0)
        fut.set_exception(ValueError("failed"))
        del fut
        assert await task == "caught"
        del task
        await asyncio.sleep(0)

    _timed(main)
    assert refs and refs[0]() is None, "the helper's frame outlived the step (a cycle)"
