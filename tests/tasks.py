"""Backend-neutral task helpers for the shared client suite, which runs under asyncio
and trio through anyio's pytest plugin."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

T = TypeVar("T")


async def in_task(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Await ``fn(*args)`` in a task of its own (so on its own stream); its result, or
    its exception as it is (not in an exception group)."""
    out: list[T] = []
    errors: list[BaseException] = []

    async def run() -> None:
        try:
            out.append(await fn(*args))
        except Exception as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
    if errors:
        raise errors[0]
    return out[0]


async def actor_idle(client: Any) -> None:
    """Let ``client``'s actor go back to waiting for work, in a fresh loop iteration
    (for tests that count the one-call routes). On a loaded machine a command the actor
    ran (a compile, a large read, a sync) can outlast its drain's budget: it then yields
    once before it waits again, and a step of the test can spend the loop iteration's
    inline budget. A route offered meanwhile declines (commands must not pass the one the
    actor is inside), which is right, but not what such a test checks. Stricter than
    ``Channel.idle()``, which counts an actor yielding between slices as idle."""
    channel = client._channel
    for _ in range(100):
        await channel.backend.checkpoint()
        if channel._wakeup is not None and not channel._queue:
            return
    raise AssertionError("the actor did not go idle in 100 loop steps")
