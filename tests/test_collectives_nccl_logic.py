"""The collectives' NCCL path without a GPU (host clients standing in for CUDA ones, a
fake library): the loop never calls NCCL (every call on the communicator set's issue
thread, in call order), and each collective's grouped calls, failures and taints."""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import anyio
import numpy as np
import pytest

import asynccube as ac
from asynccube._core.client import collective as client_collective
from asynccube._core.client import nccl_reduce
from asynccube._core.cuda import collective

from .nccl_fakes import FakeCuda, SlowLib, side

pytestmark = pytest.mark.anyio


class FakeServer:
    """What ``cuda.collective`` reads of a CUDA server (weakly referenced)."""

    def __init__(self, ordinal: int) -> None:
        self.context = types.SimpleNamespace(ordinal=ordinal)
        self.close_hooks: list[Any] = []


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def fake_nccl(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Installs a :class:`FakeCuda` over the library given; its sets are destroyed
    after the test (off the loop: destroying waits for the issue thread)."""
    made: list[FakeCuda] = []

    def install(lib: SlowLib) -> FakeCuda:
        fake = FakeCuda(lib)
        made.append(fake)
        monkeypatch.setattr(nccl_reduce, "_cuda", lambda: fake)
        monkeypatch.setattr(client_collective, "_nccl_path", lambda clients, dtype: "libfake.so")
        return fake

    yield install
    for fake in made:
        fake.destroy()


async def test_a_slow_group_end_leaves_the_loop_free(fake_nccl: Any) -> None:
    """NCCL's group end blocking 50 ms (its first connection, a full launch queue) runs
    on the set's issue thread: the loop-lag probe (5 ms) sees nothing, a ticker keeps
    ticking meanwhile, and each client's read still comes after the reduction."""
    lib = SlowLib(end_sleep=0.05)
    fake = fake_nccl(lib)
    ticks = 0
    async with ac.open_client("host") as c0, ac.open_client("host") as c1:
        h0, h1 = c0.create(bytes(16)), c1.create(bytes(16))

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await anyio.sleep(0.002)

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            for _ in range(3):
                await ac.all_reduce([(c0, h0), (c1, h1)], "float32")
            tg.cancel_scope.cancel()
    assert ticks >= 10  # the loop ran other tasks through 150 ms of group ends
    assert threading.get_ident() not in lib.threads  # no NCCL call on the loop's thread
    assert len(lib.threads) == 1  # one issue thread for the set
    assert [c[0] for c in lib.calls].count("end") == 3
    assert len(fake.finished) == 6


async def test_back_to_back_calls_reach_nccl_in_call_order(fake_nccl: Any) -> None:
    """Calls queued without an await between them reach NCCL in call order, each group
    whole, and later commands on each client come after every one of them."""
    lib = SlowLib(end_sleep=0.01)
    fake_nccl(lib)
    async with ac.open_client("host") as c0, ac.open_client("host") as c1:
        h0, h1 = c0.create(bytes(64)), c1.create(bytes(64))
        pairs = [(c0, h0), (c1, h1)]
        counts = [16, 3, 9, 1, 12]
        done = [ac.all_reduce(pairs, "float32", count=n) for n in counts]
        reads = [c.read([h]) for c, h in pairs]
        for read in reads:
            await read
        grouped = [c for c in lib.calls if c[0] in ("start", "end", "all_reduce")]
        assert grouped == [
            call
            for n in counts
            for call in (
                ("start",),
                ("all_reduce", side(h0), n, 7, 0, 100, 7),
                ("all_reduce", side(h1), n, 7, 0, 101, 7),
                ("end",),
            )
        ]
        for d in done:
            await d


def test_the_issue_thread_runs_in_order_and_destroy_waits_for_it() -> None:
    lib = SlowLib()
    servers = [FakeServer(0), FakeServer(1)]
    comms = collective.Comms(lib, servers, [10, 11])
    ran: list[int] = []
    outcomes: list[BaseException | None] = []
    loop_thread = threading.get_ident()

    def work(i: int) -> Any:
        def call() -> None:
            assert threading.get_ident() != loop_thread
            time.sleep(0.01)
            ran.append(i)
            if i == 1:
                raise RuntimeError("NCCL said no")

        return call

    for i in range(3):
        comms.submit(work(i), outcomes.append)
    comms.destroy()  # blocking: waits for the three, then frees the communicators
    assert ran == [0, 1, 2] and lib.destroyed == [10, 11]
    assert outcomes[0] is None and isinstance(outcomes[1], RuntimeError) and outcomes[2] is None
    with pytest.raises(ac.CollectiveError, match="destroyed"):
        comms.submit(work(3), outcomes.append)
    assert ran == [0, 1, 2]


async def test_a_destroyed_set_fails_the_call_and_every_client_serves(fake_nccl: Any) -> None:
    fake = fake_nccl(SlowLib())
    async with ac.open_client("host") as c0, ac.open_client("host") as c1:
        h0, h1 = c0.create(np.ones(4, np.float32)), c1.create(np.ones(4, np.float32))
        await ac.all_reduce([(c0, h0), (c1, h1)], "float32")
        await anyio.to_thread.run_sync(fake.destroy)  # a client of the set closed
        with pytest.raises(ac.CollectiveError, match="unchanged") as raised:
            await ac.all_reduce([(c0, h0), (c1, h1)], "float32")
        assert "destroyed" in str(raised.value)
        for c, h in ((c0, h0), (c1, h1)):
            await c.sync()
            assert await c.read([h]) == [np.ones(4, np.float32).tobytes()]  # not tainted
