"""A completion that finishes after its loop closed (see ``channel.completion.to_loop``)."""

from __future__ import annotations

import asyncio

from asynccube._core.channel.completion import to_loop


def test_a_completion_that_finishes_after_its_loop_closed_is_dropped() -> None:
    """A completion's thread (a client's close, a waiter) may finish after the loop has
    ended: the hand-back is dropped instead of raising in that thread; before the loop
    closes it is delivered."""
    loop = asyncio.new_event_loop()
    got: list[int] = []
    call = to_loop(loop)
    call(got.append, 1)
    loop.run_until_complete(asyncio.sleep(0))
    assert got == [1]
    loop.close()
    call(got.append, 2)  # raised RuntimeError("Event loop is closed") before
    assert got == [1]
