"""Counting the event loop's iterations, for tests and benchmarks that check how many
times an await suspends (a sync the device is done with must wake its caller in the next
iteration, not the one after).

:func:`loop_ticks` queues a callback that queues itself again each iteration and counts
its runs; the callback runs once per iteration of any asyncio loop (uvloop included),
after the callbacks queued before it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["loop_ticks"]


def loop_ticks() -> tuple[list[int], Callable[[], None]]:
    """A count of the running loop's iterations from now on (``count[0]``), and what
    stops it (the callback runs once more, then no longer queues itself)."""
    loop = asyncio.get_running_loop()
    count, stop = [0], [False]

    def tick() -> None:
        count[0] += 1
        if not stop[0]:
            loop.call_soon(tick)

    loop.call_soon(tick)
    return count, lambda: stop.__setitem__(0, True)
