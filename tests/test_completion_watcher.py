"""The completion watcher's short spin: only for a caller about to await (the channel
running a command inline), never in the actor, and backing off after a spin runs out."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

import asynccube as ac
from asynccube._core.channel.completion import SPIN_BACKOFF, CompletionWatcher

pytestmark = pytest.mark.asyncio


class _LoopCompletion:
    """Calls back on the loop (as a CUDA completion does); done after ``polls`` polls
    (never when None); its result is ``value``."""

    calls_back_on_loop = True

    def __init__(self, polls: int | None, value: Any = "done") -> None:
        self.polls = 0
        self._until = polls
        self._value = value
        self.callbacks: list[Callable[[], None]] = []

    def done(self) -> bool:
        self.polls += 1
        return self._until is not None and self.polls > self._until

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        self.callbacks.append(fn)
        loop = asyncio.get_running_loop()

        def check() -> None:
            if self.done():
                fn()
            else:
                loop.call_soon(check)

        loop.call_soon(check)

    def result(self) -> Any:
        return self._value


def _watcher() -> CompletionWatcher:
    return CompletionWatcher(asyncio.get_running_loop())


async def test_a_spin_resolves_short_work_before_the_caller_suspends() -> None:
    watcher, seen = _watcher(), []
    completion = _LoopCompletion(polls=3)
    watcher.watch(completion, lambda c: seen.append(c.result()), spin=True)
    assert seen == ["done"]  # resolved inside watch(): no loop iteration
    assert completion.callbacks == [] and watcher.spins == 1


async def test_without_spin_the_completion_calls_back_later() -> None:
    watcher, got = _watcher(), asyncio.get_running_loop().create_future()
    completion = _LoopCompletion(polls=3)
    watcher.watch(completion, lambda c: got.set_result(c.result()))
    assert completion.polls == 1 and not got.done()  # one check, no spin
    assert await asyncio.wait_for(got, 5) == "done"
    assert watcher.spins == 0 and len(completion.callbacks) == 1


async def test_a_spin_that_runs_out_skips_the_next_spins() -> None:
    watcher = _watcher()
    slow = [_LoopCompletion(polls=None) for _ in range(SPIN_BACKOFF + 2)]
    for completion in slow:
        watcher.watch(completion, lambda c: None, spin=True)
    polls = [c.polls for c in slow]
    assert watcher.spins == 2  # the first, then the one after SPIN_BACKOFF skips
    assert polls[0] > 1 and polls[-1] > 1
    assert polls[1:-1] == [1] * SPIN_BACKOFF  # skipped: only the first check
    for c in slow:  # every one still calls back (here: never done, so never called)
        assert len(c.callbacks) == 1
    ok = _LoopCompletion(polls=2)
    watcher.watch(ok, lambda c: None, spin=True)  # the next skips again after a miss
    assert ok.callbacks and ok.polls == 1


class _SlowReads(ac.HostServer):
    """A host server whose reads complete after two polls, calling back on the loop."""

    def read(self, descriptors: Sequence[Any], stream: Any) -> Any:
        inner = super().read(descriptors, stream)
        self.end_batch()  # the host streams run what is queued (a copy of 16 bytes)
        assert inner.wait(5.0)
        return _LoopCompletion(polls=2, value=inner.result())


async def test_only_a_command_run_inline_spins_not_the_actor() -> None:
    """The first read runs inline (its caller awaits next: it spins); the second is
    queued behind it (budget 1 µs) and run by the actor, which must not spin."""
    client = ac.ComputeClient(_SlowReads(), asyncio.get_running_loop(), batch_seconds=1e-6)
    try:
        handle = client.create(np.arange(4, dtype=np.uint32))
        await client.sync()
        watcher = client._channel.watcher
        first, second = client.read([handle]), client.read([handle])
        assert first.done() and not second.done()  # inline, resolved in its spin
        assert (await first) == (await second) == [np.arange(4, dtype=np.uint32).tobytes()]
        assert watcher.spins == 1
    finally:
        await client.close()
