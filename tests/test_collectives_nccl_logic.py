"""The collectives' NCCL path without a GPU (host clients standing in for CUDA ones, a
fake library): the loop never calls NCCL (every call on the communicator set's issue
thread, in call order), and each collective's grouped calls, failures and taints."""

from __future__ import annotations

import threading
import time
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
from .test_all_reduce_nccl_logic import FakeServer

pytestmark = pytest.mark.anyio

REAL_INLINE_BELOW = collective.INLINE_BELOW
ROOMY_INLINE_BELOW = 0.008


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def fake_nccl(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Installs a :class:`FakeCuda` over the library given; its sets are destroyed
    after the test (off the loop: destroying waits for the issue thread).

    A group of the fake takes microseconds, but a loaded 2-core CI host can stretch one
    past the real :data:`~collective.INLINE_BELOW` (250 us), which would send its kind
    back to the issue thread at random (CI saw it once); the bar here is 8 ms, under
    the 10 ms and more that the slow fakes below sleep. The test of the bar itself puts
    the real one back."""
    made: list[FakeCuda] = []
    monkeypatch.setattr(collective, "INLINE_BELOW", ROOMY_INLINE_BELOW)

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


# -- broadcast, all_gather, reduce_scatter ---------------------------------------------


def _collectives(c0: Any, c1: Any, hs: list[Any]) -> dict[str, Any]:
    """Each collective over two clients: hs[0..1] 16 bytes, hs[2..3] 32 bytes."""
    return {
        "all_reduce": lambda: ac.all_reduce([(c0, hs[0]), (c1, hs[1])], "float32"),
        "broadcast": lambda: ac.broadcast([(c0, hs[0]), (c1, hs[1])], root=1, count=12),
        "all_gather": lambda: ac.all_gather([(c0, hs[0], hs[2]), (c1, hs[1], hs[3])]),
        "reduce_scatter": lambda: ac.reduce_scatter(
            [(c0, hs[2], hs[0]), (c1, hs[3], hs[1])], "float32", "max"
        ),
    }


WRITTEN = {"all_reduce": (0, 1), "broadcast": (0,), "all_gather": (2, 3), "reduce_scatter": (0, 1)}
"""The buffers (indices into hs) each collective above writes."""


async def _serving_after_the_failure(name: str, owners: list[Any], hs: list[Any]) -> None:
    """After a failed ``name`` over ``hs`` (owned by ``owners``): each client's sync is
    clean (the failure was raised once, by the collective's await), the buffers the
    collective writes are tainted until written again, and every buffer reads clean."""
    for i, (c, h) in enumerate(zip(owners, hs, strict=True)):
        await c.sync()  # taken by the await above: raised once
        if i in WRITTEN[name]:
            with pytest.raises(ac.TaintedBuffer):
                await c.read([h])
            c.write([(h.copy_descriptor((h.binding().size,), (1,), 1), bytes(h.binding().size))])
        assert await c.read([h]) == [bytes(h.binding().size)]  # clean, serving


def _expected_calls(name: str, hs: list[Any]) -> list[tuple[Any, ...]]:
    a, b, c, d = (side(h) for h in hs)
    return {
        "all_reduce": [("all_reduce", a, 4, 7, 0, 100, 7), ("all_reduce", b, 4, 7, 0, 101, 7)],
        "broadcast": [("broadcast", a, a, 12, 1, 1, 100, 7), ("broadcast", b, b, 12, 1, 1, 101, 7)],
        "all_gather": [("all_gather", a, c, 16, 1, 100, 7), ("all_gather", b, d, 16, 1, 101, 7)],
        "reduce_scatter": [
            ("reduce_scatter", c, a, 4, 7, 2, 100, 7),
            ("reduce_scatter", d, b, 4, 7, 2, 101, 7),
        ],
    }[name]


def _four(c0: Any, c1: Any) -> list[Any]:
    return [c0.create(bytes(16)), c1.create(bytes(16)), c0.create(bytes(32)), c1.create(bytes(32))]


@pytest.mark.parametrize("name", ["all_reduce", "broadcast", "all_gather", "reduce_scatter"])
async def test_each_collective_groups_one_call_per_rank_off_the_loop(
    fake_nccl: Any, name: str
) -> None:
    lib = SlowLib(end_sleep=0.05)  # the loop-lag probe fails a call made on the loop
    fake = fake_nccl(lib)
    async with ac.open_client("host") as c0, ac.open_client("host") as c1:
        hs = _four(c0, c1)
        await _collectives(c0, c1, hs)[name]()
        assert lib.calls[0] == ("start",) and lib.calls[-1] == ("end",)
        assert lib.collective_calls() == _expected_calls(name, hs)
        assert threading.get_ident() not in lib.threads
        assert [device for device, _ in fake.finished] == [c0.device, c1.device]


@pytest.mark.parametrize("name", ["broadcast", "all_gather", "reduce_scatter"])
async def test_a_failed_call_is_held_on_every_client_and_taints_what_it_writes(
    fake_nccl: Any, name: str
) -> None:
    fake_nccl(SlowLib(fail=name))
    async with ac.open_client("host") as c0, ac.open_client("host") as c1:
        hs = _four(c0, c1)
        owners = [c0, c1, c0, c1]
        with pytest.raises(ac.CollectiveError, match=f"{name} over 2 .*may have changed") as raised:
            await _collectives(c0, c1, hs)[name]()
        assert "invalid usage" in str(raised.value)  # NCCL's words
        await _serving_after_the_failure(name, owners, hs)


@pytest.mark.parametrize("name", ["broadcast", "all_gather", "reduce_scatter"])
async def test_a_tainted_input_is_refused_before_nccl_runs(fake_nccl: Any, name: str) -> None:
    lib = SlowLib()
    fake_nccl(lib)
    async with ac.open_client("host") as c0, ac.open_client("host") as c1:
        hs = _four(c0, c1)
        source = {"broadcast": 1, "all_gather": 1, "reduce_scatter": 3}[name]
        c1._channel._held.taint([hs[source].memory.id], RuntimeError("earlier failure"))
        with pytest.raises(ac.CollectiveError, match="unchanged"):
            await _collectives(c0, c1, hs)[name]()
        assert lib.calls == []  # nothing issued
        await c0.sync()
        await c1.sync()


async def test_a_kind_nccl_issued_fast_is_issued_in_place_until_it_is_slow(
    fake_nccl: Any,
) -> None:
    """The first group of a kind (collective, type, operation, size class) runs on the
    issue thread; once NCCL issued it fast, the next ones of that kind are issued on
    the caller's thread (no hop there and back); another kind still goes to the
    thread, and a group of the kind that turns slow sends the kind back to it."""
    lib = SlowLib()
    fake_nccl(lib)
    loop_thread = threading.get_ident()
    async with ac.open_client("host") as c0, ac.open_client("host") as c1:
        h0, h1 = c0.create(bytes(4096)), c1.create(bytes(4096))
        pairs = [(c0, h0), (c1, h1)]
        await ac.all_reduce(pairs, "float32")
        assert loop_thread not in lib.threads  # a kind's first group: the thread
        await ac.all_reduce(pairs, "float32")
        assert loop_thread in lib.threads  # fast last time: in place
        for kind in (("float32", "max", None), ("float32", "sum", 7), ("int32", "sum", None)):
            lib.threads.clear()
            await ac.all_reduce(pairs, kind[0], kind[1], count=kind[2])
            assert lib.threads and loop_thread not in lib.threads, kind  # another kind
        collective.INLINE_BELOW = REAL_INLINE_BELOW  # the fixture's monkeypatch restores
        lib.end_sleep = 0.001  # above INLINE_BELOW: NCCL was slow this time
        await ac.all_reduce(pairs, "float32")
        collective.INLINE_BELOW = ROOMY_INLINE_BELOW
        lib.end_sleep, lib.threads = 0.0, set()
        await ac.all_reduce(pairs, "float32")
        assert lib.threads and loop_thread not in lib.threads  # back to the thread
        ends = [c for c in lib.calls if c[0] == "end"]
        assert len(ends) == 7


# -- one step when every actor is idle ---------------------------------------------------

ALL = ["all_reduce", "broadcast", "all_gather", "reduce_scatter"]


def _count_sends(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every ``Channel.send`` from now on: its command, in order."""
    from asynccube._core.channel.channel import Channel

    sent: list[Any] = []
    real = Channel.send

    def send(self: Any, op: Any, *args: Any) -> None:
        sent.append(op)
        real(self, op, *args)

    monkeypatch.setattr(Channel, "send", send)
    return sent


@pytest.mark.parametrize("name", ALL)
async def test_an_idle_collective_runs_in_one_step_at_the_call(
    fake_nccl: Any, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """Both actors idle, the communicators made and the kind issued fast last time: the
    whole collective (every side prepared, the group) runs before the call returns, as
    one command of the first client: no prepare, issue and after command per client
    (five sends before), nothing left queued; no buffer held (each one's last use, the
    collective, was stamped by its prepare before the group was issued)."""
    lib = SlowLib()
    fake = fake_nccl(lib)
    async with ac.open_client("host") as c0, ac.open_client("host") as c1:
        hs = _four(c0, c1)
        call = _collectives(c0, c1, hs)[name]
        await call()  # the kind's first group: on the issue thread
        lib.calls.clear()
        lib.threads.clear()
        fake.finished.clear()
        sent = _count_sends(monkeypatch)
        done = call()
        assert lib.collective_calls() == _expected_calls(name, hs)  # issued already
        assert lib.threads == {threading.get_ident()}
        assert fake.finished == []
        assert len(sent) == 1
        assert not c0._channel._queue and not c1._channel._queue
        await done


@pytest.mark.parametrize("name", ALL)
async def test_a_failure_in_one_step_is_held_on_every_client_and_taints_what_it_writes(
    fake_nccl: Any, name: str
) -> None:
    lib = SlowLib()
    fake_nccl(lib)
    async with ac.open_client("host") as c0, ac.open_client("host") as c1:
        hs = _four(c0, c1)
        owners = [c0, c1, c0, c1]
        call = _collectives(c0, c1, hs)[name]
        await call()
        lib.fail, lib.threads = name, set()
        with pytest.raises(ac.CollectiveError, match=f"{name} over 2 .*may have changed"):
            await call()
        assert lib.threads == {threading.get_ident()}  # it ran in place, in one step
        await _serving_after_the_failure(name, owners, hs)


async def test_a_busy_client_takes_the_commands_route_after_its_earlier_work(
    fake_nccl: Any,
) -> None:
    """One client's actor awaits a command's job: the collective is queued behind it
    there (nothing issued at the call), issued once that job ends, then awaited."""
    lib = SlowLib()
    fake_nccl(lib)
    released = anyio.Event()
    order: list[str] = []

    async def job() -> None:
        await released.wait()
        order.append("job")

    async with ac.open_client("host") as c0, ac.open_client("host") as c1:
        hs = _four(c0, c1)
        call = _collectives(c0, c1, hs)["all_reduce"]
        await call()
        lib.calls.clear()
        c1._channel.send(job)  # its actor awaits it (a compile, say)
        done = call()
        assert lib.calls == []  # queued behind the job on c1: nothing issued yet
        await anyio.sleep(0.01)
        assert lib.calls == []
        released.set()
        await done
        order.append("collective")
        assert order == ["job", "collective"]
        assert lib.collective_calls() == _expected_calls("all_reduce", hs)


async def test_awaited_by_another_task_it_raises_the_callers_failure(fake_nccl: Any) -> None:
    """Awaited from a task other than the caller's, the awaitable still syncs the
    caller's stream: the failure held there is raised, once."""
    lib = SlowLib()
    fake_nccl(lib)
    async with ac.open_client("host") as c0, ac.open_client("host") as c1:
        hs = _four(c0, c1)
        call = _collectives(c0, c1, hs)["all_reduce"]
        await call()
        lib.fail = "all_reduce"
        done = call()
        raised: list[BaseException] = []

        async def other() -> None:
            try:
                await done
            except ac.CollectiveError as exc:
                raised.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(other)
        assert len(raised) == 1 and "may have changed" in str(raised[0])
        lib.fail = None
        for c, h in ((c0, hs[0]), (c1, hs[1])):
            await c.sync()  # the caller's stream: nothing held any more
            c.write([(h.copy_descriptor((16,), (1,), 1), bytes(16))])
            assert await c.read([h]) == [bytes(16)]  # clean again, serving
        await call()


async def test_a_client_closed_before_the_await_makes_it_raise_closed(fake_nccl: Any) -> None:
    fake_nccl(SlowLib())
    async with ac.open_client("host") as c0:
        c1 = await ac.connect("host")
        hs = _four(c0, c1)
        call = _collectives(c0, c1, hs)["all_reduce"]
        await call()
        done = call()  # in one step: issued already
        await c1.close()
        with pytest.raises(ac.ClientClosedError):
            await done
        await c0.sync()


async def test_a_set_declining_in_place_after_the_check_hands_the_call_to_its_thread(
    fake_nccl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The set declines to run the group in place after ``inline_ready`` said yes (it
    was being destroyed meanwhile, from a close thread): the prepared sides go to the
    issue thread, each client's after step waits for it, and the result is the same."""
    lib = SlowLib()
    fake = fake_nccl(lib)
    async with ac.open_client("host") as c0, ac.open_client("host") as c1:
        hs = _four(c0, c1)
        call = _collectives(c0, c1, hs)["all_reduce"]
        await call()
        lib.calls.clear()
        lib.threads.clear()
        fake.finished.clear()
        monkeypatch.setattr(collective.Comms, "run_inline", lambda self, key, call: False)
        done = call()
        await done
        assert lib.collective_calls() == _expected_calls("all_reduce", hs)
        assert lib.threads and threading.get_ident() not in lib.threads
        assert [device for device, _ in fake.finished] == [c0.device, c1.device]
        assert await c0.read([hs[0]]) == [bytes(16)]
