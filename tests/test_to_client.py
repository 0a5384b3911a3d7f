"""``to_client`` between clients, and several clients on one loop."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import numpy as np
import pytest

import asynccube as ac
from asynccube._core.runtime.devices import probe_gpus

from .kernels import SCALE, SLOW_FILL, SPIN, blocks, spin

pytestmark = pytest.mark.asyncio

_GPUS = len(probe_gpus().devices)
two_gpus = pytest.mark.skipif(_GPUS < 2, reason=f"needs two CUDA GPUs ({_GPUS} found)")

PAIRS = [
    ("host", "host"),
    pytest.param("host", "cuda:0", marks=pytest.mark.cuda),
    pytest.param("cuda:0", "host", marks=pytest.mark.cuda),
    pytest.param("cuda:0", "cuda:0", marks=pytest.mark.cuda),
    pytest.param("cuda:0", "cuda:1", marks=[pytest.mark.cuda, two_gpus]),
    pytest.param("cuda:1", "cuda:0", marks=[pytest.mark.cuda, two_gpus]),
]


def scale(h: ac.Handle, factor: float, n: int) -> ac.Bindings:
    """Bindings for SCALE over n float32."""
    b = ac.Bindings().with_buffer(h.binding()).with_scalar(np.float32, [factor])
    return b.with_scalar(np.uint32, [n])


@pytest.mark.parametrize(("a", "b"), PAIRS)
async def test_to_client_copies_and_orders_both_sides(a: str, b: str) -> None:
    n = 1 << 16
    x = np.arange(n, dtype=np.float32)
    async with ac.open_client(a) as src, ac.open_client(b) as dst:
        h = src.create(x)
        src.execute(SCALE, blocks(n), scale(h, 2.0, n))  # queued before: the copy sees it
        copy = src.to_client(h, dst)
        src.execute(SCALE, blocks(n), scale(h, 0.0, n))  # queued after: the copy is not hit
        dst.execute(SCALE, blocks(n), scale(copy, 3.0, n))  # ordered after the copy
        np.testing.assert_array_equal(await dst.read_array(copy, np.float32), x * 6)
        np.testing.assert_array_equal(await src.read_array(h, np.float32), np.zeros(n))
        back = dst.to_client(copy, src)
        np.testing.assert_array_equal(await src.read_array(back, np.float32), x * 6)


@pytest.mark.parametrize(("a", "b"), PAIRS)
async def test_a_batch_of_copies_past_the_budget_keeps_both_orders(a: str, b: str) -> None:
    """Hundreds of ``to_client`` calls in a row (past the loop iteration's budget, so
    most wait in both actors' queues and each actor runs the whole copy for the other):
    each copy holds what the source's earlier work wrote and nothing of its later work,
    and the destination's later work sees the copy. In steps of 100 calls: each past the
    budget (1 ms), each well under the 5 ms probe on the slower pairs (host staging,
    two GPUs: 400 calls in one step held the loop past it)."""
    n, count = 1 << 10, 400
    x = np.arange(n, dtype=np.float32)
    async with ac.open_client(a) as src, ac.open_client(b) as dst:
        h = src.create(x)
        src.execute(SCALE, blocks(n), scale(h, 2.0, n))  # before: in every copy
        copies = []
        for _ in range(count // 100):
            copies += [src.to_client(h, dst) for _ in range(100)]
            await asyncio.sleep(0)
        src.execute(SCALE, blocks(n), scale(h, 0.0, n))  # after: in none
        dst.execute(SCALE, blocks(n), scale(copies[-1], 3.0, n))  # after the last copy
        for copy in copies[:-1:37]:
            np.testing.assert_array_equal(await dst.read_array(copy, np.float32), x * 2)
        np.testing.assert_array_equal(await dst.read_array(copies[-1], np.float32), x * 6)
        np.testing.assert_array_equal(await src.read_array(h, np.float32), np.zeros(n))


@pytest.mark.parametrize(("a", "b"), PAIRS)
async def test_source_buffer_lives_until_the_copy_ran(a: str, b: str) -> None:
    async with ac.open_client(a) as src, ac.open_client(b) as dst:
        n = 1 << 15
        h = src.create(np.full(n, 7, np.float32))
        copy = src.to_client(h, dst)
        del h
        gc.collect()
        for _ in range(4):  # reuse of the dropped slice must not clobber the copy
            src.create(np.zeros(n, np.float32))
        np.testing.assert_array_equal(await dst.read_array(copy, np.float32), np.full(n, 7))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("host", "host"),
        pytest.param("cuda:0", "cuda:0", marks=pytest.mark.cuda),
        pytest.param("cuda:0", "cuda:1", marks=[pytest.mark.cuda, two_gpus]),
    ],
)
async def test_to_client_is_ordered_without_a_host_wait(a: str, b: str) -> None:
    """The source is busy (a slow kernel, then a write of the buffer) when to_client and
    a kernel on the copy are called, with no await between: both return long before the
    slow kernel ends (the order is kept by events, not by the caller waiting), the copy
    holds what the write put there, and the source's later write is not in it."""
    import time

    n, busy = 1 << 16, 0.4
    async with ac.open_client(a) as src, ac.open_client(b) as dst:
        h = src.create(np.ones(n, np.float32))
        warm = src.to_client(h, dst)  # peer access and the kernels ready beforehand
        dst.execute(SCALE, blocks(n), scale(warm, 1.0, n))
        src.execute(SPIN, ac.CubeCount(1), spin(0.0))
        await dst.read([warm])
        await src.sync()
        src.execute(SPIN, ac.CubeCount(1), spin(busy))
        src.execute(SCALE, blocks(n), scale(h, 3.0, n))  # queued before: in the copy
        t0 = time.perf_counter()
        copy = src.to_client(h, dst)
        dst.execute(SCALE, blocks(n), scale(copy, 2.0, n))  # after the copy
        queued = time.perf_counter() - t0
        src.execute(SCALE, blocks(n), scale(h, 0.0, n))  # after the copy: not in it
        got = await dst.read_array(copy, np.float32)
        done = time.perf_counter() - t0
        np.testing.assert_array_equal(got, np.full(n, 6.0, np.float32))
        np.testing.assert_array_equal(await src.read_array(h, np.float32), np.zeros(n))
        assert queued < busy / 2, f"to_client waited for the source's work: {queued:.3f} s"
        assert done > 0.9 * busy, f"the copy did not wait for the source's work: {done:.3f} s"


async def test_to_client_waits_for_slow_host_work() -> None:
    async with ac.open_client("host") as src, ac.open_client("host") as dst:
        h = src.empty(64)
        fill = ac.Bindings().with_buffer(h.binding()).with_scalar(np.float32, [0.05])
        src.execute(SLOW_FILL, ac.CubeCount(1), fill.with_scalar(np.uint8, [9]))
        copy = src.to_client(h, dst)
        assert await dst.read([copy]) == [bytes([9]) * 64]


async def test_bad_to_client_calls_raise_and_clients_keep_serving() -> None:
    async with (
        ac.open_client("host") as a,
        ac.open_client("host") as b,
        ac.open_client("host") as third,
    ):
        foreign = third.create(b"third")
        with pytest.raises(ac.InvalidHandle, match="does not belong to this host client"):
            a.to_client(foreign, b)
        with pytest.raises(ac.InvalidArgument, match="needs another client"):
            a.to_client(a.create(b"x"), a)
        with pytest.raises(ac.InvalidArgument, match="Handle or Binding"):
            a.to_client(b"raw", b)  # type: ignore[arg-type]
        closed = await ac.connect("host")
        await closed.close()
        with pytest.raises(ac.ClientClosedError):
            a.to_client(a.create(b"y"), closed)
        h = a.create(b"still fine")
        assert await b.read([a.to_client(h, b)]) == [b"still fine"]
        assert await third.read([foreign]) == [b"third"]


async def test_copy_to_a_client_that_dies_fails_without_hanging() -> None:
    async with ac.open_client("host") as a:
        b = await ac.connect("host")
        h = a.create(b"abc")
        copy = a.to_client(h, b)
        b._channel.kill_for_test(RuntimeError("boom"))
        with pytest.raises(ac.ClientDeadError):
            await b.read([copy])
        assert await a.read([h]) == [b"abc"]
        await b.close()  # a dead client closes quietly


async def test_many_clients_on_one_loop() -> None:
    clients = [await ac.connect("host") for _ in range(4)]
    try:
        hs = [c.create(np.full(8, i, np.float32)) for i, c in enumerate(clients)]
        ring = [clients[i].to_client(hs[i], clients[(i + 1) % 4]) for i in range(4)]
        got = await asyncio.gather(
            *(clients[(i + 1) % 4].read_array(ring[i], np.float32) for i in range(4))
        )
        for i, arr in enumerate(got):
            np.testing.assert_array_equal(arr, np.full(8, i))
    finally:
        for c in clients:
            await c.close()


@pytest.mark.cuda
async def test_a_device_that_does_not_exist_raises() -> None:
    with pytest.raises(ac.DeviceError, match=r"there is no GPU cuda:99"):
        await ac.connect("cuda:99")
    async with ac.open_client("cuda:0") as client:
        assert await client.read([client.create(b"ok")]) == [b"ok"]


_SRC = str(Path(__file__).resolve().parent.parent / "src")


def _powf32(base: float, times: int) -> np.float32:
    """``base ** times`` as float32 multiplications give it (3**20 is not a float32)."""
    out = np.float32(1.0)
    for _ in range(times):
        out = np.float32(out * np.float32(base))
    return out


@pytest.mark.cuda
@two_gpus
async def test_each_client_runs_on_its_own_device() -> None:
    n = 1 << 16
    async with ac.open_client("cuda:0") as c0, ac.open_client("cuda:1") as c1:
        h0, h1 = c0.create(np.ones(n, np.float32)), c1.create(np.ones(n, np.float32))
        for _ in range(20):  # interleaved: each command must run in its own context
            c0.execute(SCALE, blocks(n), scale(h0, 2.0, n))
            c1.execute(SCALE, blocks(n), scale(h1, 3.0, n))
        r0, r1 = await asyncio.gather(c0.read_array(h0, np.float32), c1.read_array(h1, np.float32))
        np.testing.assert_array_equal(r0, np.full(n, _powf32(2.0, 20)))
        np.testing.assert_array_equal(r1, np.full(n, _powf32(3.0, 20)))
        res0 = await c0.get_resource(h0)
        res1 = await c1.get_resource(h1)
        assert c0.properties.extra["ordinal"] == 0
        assert c1.properties.extra["ordinal"] == 1
        assert res0.size == res1.size == 4 * n


@pytest.mark.cuda
@two_gpus
async def test_info_shows_peer_links() -> None:
    import os
    import subprocess
    import sys

    src = _SRC
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "asynccube", "info"]
    out = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "peer links:" in out.stdout
    assert "cuda:0 <-> cuda:1" in out.stdout


@pytest.mark.parametrize(("a", "b"), PAIRS)
async def test_to_client_from_a_busy_source_waits_for_its_work(a: str, b: str) -> None:
    """The source's actor is busy compiling a new kernel when to_client is called, so
    the copy's source side runs later than the destination's: the destination waits
    for it and copies what the kernel wrote."""
    import uuid

    n = 1 << 16
    tag = uuid.uuid4().hex
    fresh = ac.Kernel(
        f"test_fresh_scale_{tag}",
        cuda=ac.CudaSource(f"// {tag}\n" + SCALE.cuda.source, entry="scale"),  # type: ignore[union-attr]
        host=SCALE.host,
    )
    async with ac.open_client(a) as ca, ac.open_client(b) as cb:
        h = ca.create(np.ones(n, np.float32))
        ca.execute(fresh, blocks(n), scale(h, 4.0, n))
        copies = [ca.to_client(h, cb) for _ in range(3)]
        ca.execute(fresh, blocks(n), scale(h, 0.5, n))  # after the copies, on the source
        for copy in copies:
            np.testing.assert_array_equal(await cb.read_array(copy, np.float32), np.full(n, 4.0))
        np.testing.assert_array_equal(await ca.read_array(h, np.float32), np.full(n, 2.0))


@pytest.mark.cuda
@two_gpus
async def test_peer_access_is_enabled_again_for_new_clients() -> None:
    """Closing a client resets its device's context and drops its pool: the clients
    opened after it must enable peer access (and pool access) again, or the driver
    stages each peer copy through the host at a tenth of the bandwidth."""
    from asynccube._core.cuda.driver import check, cu

    d = cu()
    for _ in range(2):
        async with ac.open_client("cuda:0") as c0, ac.open_client("cuda:1") as c1:
            h = c0.create(np.arange(1 << 16, dtype=np.float32))
            copy = c0.to_client(h, c1)
            np.testing.assert_array_equal(
                await c1.read_array(copy, np.float32), np.arange(1 << 16, dtype=np.float32)
            )
            for server, peer in ((c0.server, 1), (c1.server, 0)):
                pool = getattr(server._storage, "_pool", None)  # type: ignore[attr-defined]
                if pool is None:
                    continue  # cuMemAlloc pages: context peer access is enough
                where = d.CUmemLocation()
                where.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
                where.id = peer
                flags = check(d.cuMemPoolGetAccess(pool, where))
                assert flags == d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE


@pytest.mark.cuda
async def test_two_clients_of_one_gpu_share_its_context_object() -> None:
    """Taking turns between two clients of one GPU makes no ``cuCtxSetCurrent`` (one
    object per primary context), and copies between them in both directions hold the
    bytes."""
    async with ac.open_client("cuda:0") as a, ac.open_client("cuda:0") as b:
        assert a.server.context.context is b.server.context.context  # type: ignore[attr-defined]
        h = a.create(b"both ways")
        back = b.to_client(a.to_client(h, b), a)
        assert await a.read([back]) == [b"both ways"]


@pytest.mark.cuda
@two_gpus
async def test_peer_copies_keep_the_current_context_and_its_mark_agreed() -> None:
    """A peer copy switches to the destination's context and back through the hot
    path's ``cuCtxSetCurrent`` (not ``driver.set_current``): after each ``to_client``,
    inline or queued, the driver's current context is the one ``driver.set_current``'s
    mark names (the one-call routes trust it), and the bytes arrive both ways."""
    from asynccube._core.cuda import driver
    from asynccube._core.cuda.driver import check, cu

    want = np.arange(1024, dtype=np.float32)
    async with ac.open_client("cuda:0") as a, ac.open_client("cuda:1") as b:
        h = a.create(want)
        for step in range(8):  # 50 copies a loop step: 400 in one blocked the loop 5 ms
            await asyncio.sleep(0)  # a new step: the inline budget starts afresh
            if step % 2:  # as past the inline budget: every copy of this step queues
                for channel in (a._channel, b._channel):
                    channel._inline_spent = channel.budget
            for _ in range(25):
                copy = a.to_client(h, b)
                assert int(check(cu().cuCtxGetCurrent())) == int(driver._tls.context)
                back = b.to_client(copy, a)
                assert int(check(cu().cuCtxGetCurrent())) == int(driver._tls.context)
        np.testing.assert_array_equal(await b.read_array(copy, np.float32), want)
        np.testing.assert_array_equal(await a.read_array(back, np.float32), want)


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param("cuda:0", "cuda:0", id="one-gpu"),
        pytest.param("cuda:0", "cuda:1", marks=two_gpus, id="two-gpus"),
    ],
)
async def test_back_to_back_copies_see_the_writes_between_them(a: str, b: str) -> None:
    """Issue 38: copies sent back to back from one stream share the source's event, and
    a destination stream waits on it once. A write on the source behind a slow kernel
    (on the copies' stream, then on another task's) is seen by every copy issued after
    it and by none before it, on two destinations; the destinations kept busy, the
    source's write after a run of copies waits for their reads."""
    n = 1 << 15  # 128 KiB: below the copy helpers (256 KiB up)
    one = ac.CubeCount(1)
    async with ac.open_client(a) as ca, ac.open_client(b) as cb, ac.open_client(b) as cc:
        h = ca.create(np.ones(n, np.float32))
        for client in (ca, cb, cc):  # loaded (one module load a loop step): the calls
            client.execute(SPIN, one, spin(0))  # below run inline
            await client.sync()
        ca.execute(SCALE, blocks(n), scale(h, 1.0, n))
        await ca.sync()
        # each pair's first copies, to an idle destination and to a busy one, set up
        # their routes, and the first reads of the size take their page-locked staging
        # (an allocation that waits for the device: milliseconds, once; not what this
        # test is about)
        for client in (cb, cc):
            await client.read_array(ca.to_client(h, client), np.float32)
            client.execute(SPIN, one, spin(0.001))
            await client.read_array(ca.to_client(h, client), np.float32)
        for client in (cb, cc):
            client.execute(SPIN, one, spin(0.05))  # the copies read late
        first = [ca.to_client(h, cb) for _ in range(4)] + [ca.to_client(h, cc)]
        ca.execute(SCALE, blocks(n), scale(h, 2.0, n))  # after the copies' reads
        ca.execute(SPIN, one, spin(0.05))  # the source busy: the write below is late
        ca.execute(SCALE, blocks(n), scale(h, 2.0, n))
        second = [ca.to_client(h, cb) for _ in range(4)] + [ca.to_client(h, cc)]

        async def other() -> None:  # another task's stream writes it, late
            ca.execute(SPIN, one, spin(0.05))
            ca.execute(SCALE, blocks(n), scale(h, 2.0, n))

        await asyncio.create_task(other())
        third = [ca.to_client(h, cb) for _ in range(2)] + [ca.to_client(h, cc)]
        for copies, value in ((first, 1.0), (second, 4.0), (third, 8.0)):
            for copy, client in zip(copies, [cb] * (len(copies) - 1) + [cc], strict=True):
                got = await client.read_array(copy, np.float32)
                np.testing.assert_array_equal(got, np.full(n, value))
