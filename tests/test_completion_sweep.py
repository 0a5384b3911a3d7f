"""The CUDA completions' short waits on one loop (``cuda/completion.py``'s sweep): one
callback per loop iteration polls them all, oldest first, stopping after a few not done
yet, instead of one callback per completion per iteration; a completion past its spin
leaves for its descriptor. Fake completions (no GPU): what is polled, and when."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from asynccube._core.cuda import completion as cc

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the sweep's loop calls (call_soon) are the same under trio's adapter


class _Fake:
    """A completion done after ``polls`` calls of ``done()`` (never, for None)."""

    CHECK_SECONDS = cc.CudaCompletion.CHECK_SECONDS

    def __init__(self, polls: int | None, log: list[int], name: int, spin: float = 10.0) -> None:
        self.polls, self.log, self.name = polls, log, name
        self.SPIN_SECONDS = spin  # long by default: a slow test machine never runs out
        self.armed = False

    def done(self) -> bool:
        self.log.append(self.name)
        if self.polls is None:
            return False
        self.polls -= 1
        return self.polls < 0

    def fileno(self) -> int:
        self.armed = True
        return -1  # no descriptor: the periodic check takes over


def _watch(fake: _Fake, fired: list[int]) -> None:
    cc._Watch(fake, lambda: fired.append(fake.name), asyncio.get_running_loop()).start()  # type: ignore[arg-type]


async def _iterations(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_many_waits_cost_a_few_polls_an_iteration_not_one_each() -> None:
    """64 waits pending: an iteration polls the oldest ones until two are not done (one
    callback per completion per iteration polled all 64), and every one is resolved, in
    the order the device finishes them."""
    log: list[int] = []
    fired: list[int] = []
    fakes = [_Fake(1 + i // 8, log, i) for i in range(64)]  # 8 finish at each poll round
    for fake in fakes:
        _watch(fake, fired)
    assert len(log) == 64  # the first look, at the call
    log.clear()
    await _iterations(1)
    assert len(log) <= 8 + cc._Sweep.PEEK  # the 8 that ended and a peek: not all 64
    for _ in range(200):
        if len(fired) == 64:
            break
        before = len(log)
        await _iterations(1)
        assert len(log) - before <= 8 + cc._Sweep.PEEK + 8  # what ended, plus a peek
    assert sorted(fired) == list(range(64))
    assert not any(f.armed for f in fakes)


async def test_a_long_wait_ahead_leaves_the_sweep_after_its_spin() -> None:
    """A completion that never ends (a long kernel) is armed once its spin passed, and
    the short ones behind it are still resolved meanwhile."""
    log: list[int] = []
    fired: list[int] = []
    long = _Fake(None, log, 0, spin=cc.CudaCompletion.SPIN_SECONDS)
    _watch(long, fired)
    shorts = [_Fake(3, log, i) for i in range(1, 5)]
    for fake in shorts:
        _watch(fake, fired)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 1.0
    while len(fired) < 4 and loop.time() < deadline:  # noqa: ASYNC110 (iterations, counted)
        await asyncio.sleep(0)
    assert sorted(fired) == [1, 2, 3, 4]
    while not long.armed and loop.time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0)
    assert long.armed and 0 not in fired  # on its descriptor's check now, not polled
    sweep = cc._sweep_for(loop)
    assert not sweep._watches


@pytest.mark.parametrize("n", [1, 3])
async def test_a_wait_done_at_once_never_reaches_the_sweep(n: int) -> None:
    log: list[int] = []
    fired: list[int] = []
    for i in range(n):
        _watch(_Fake(0, log, i), fired)
    assert fired == list(range(n))
    assert not cc._sweep_for(asyncio.get_running_loop())._watches


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
def test_each_loop_has_its_own_sweep(anyio_backend: str) -> None:
    async def sweep() -> Any:
        return cc._sweep_for(asyncio.get_running_loop())

    assert asyncio.run(sweep()) is not asyncio.run(sweep())
