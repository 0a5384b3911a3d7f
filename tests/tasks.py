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
