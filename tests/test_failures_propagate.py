"""Failures propagate (issue 40, cubecl-runtime's ``ErrorGraph``): a launch binding a
buffer that carries a failure is skipped, the buffers it would have written carry the
same failure, and a read of any of them raises the root error's type naming the root and
the skipped kernels in order; a successful write clears; a failure's record lives while
some buffer carries it. Each device of the shared client suite (cuda:0 marked), asyncio
and trio; the property test drives random DAGs of launches on several streams against an
oracle of which buffer descends from which failure. The CUDA server's Python route is
also run here, without a GPU, on the no-op driver (``fast_propagate_scenario.py``)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Awaitable
from dataclasses import dataclass, field

import anyio
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asynccube as ac
from asynccube._core.channel.held import SKIP_RECORDS

from .test_edges_errors import FAILED

ADD_CUDA = r"""
extern "C" __global__ void prop_add(const unsigned *a, const unsigned *b, unsigned *out) {
    unsigned i = threadIdx.x;
    if (i < 4) out[i] = a[i] + b[i] + 1u;
}
"""
RUNS: list[str] = []
"""The ids of the add kernels that ran on the host server (a skipped one never does)."""


def _add_host(launch: ac.HostLaunch) -> None:
    a, b, out = (buf.view(np.uint32) for buf in launch.buffers)
    out[:] = a + b + 1
    RUNS.append("add")


def _add(name: str) -> ac.Kernel:
    return ac.Kernel(name, cuda=ac.CudaSource(ADD_CUDA, "prop_add", (4, 1, 1)), host=_add_host)


ADDS = [_add(f"prop_add_{k}") for k in range(3)]
"""Three kernels (out = a + b + 1 on uint32[4]) told apart by their ids in the paths."""


def _fail(launch: ac.HostLaunch) -> None:
    raise RuntimeError("root failure")


def _root(n: int) -> ac.Kernel:
    """The failing kernel of root ``n`` (its id names the root in the errors; it fails on
    every server: the host part raises, the CUDA part is missing)."""
    return ac.Kernel(f"prop_fail_{n}", host=_fail)


def _on(handles: list[ac.Handle]) -> ac.Bindings:
    return ac.Bindings().with_buffers([h.binding() for h in handles])


def _write(client: ac.ComputeClient, h: ac.Handle, values: np.ndarray) -> None:
    client.write([(h.copy_descriptor((4,), (1,), 4), values.astype(np.uint32).tobytes())])


def _path(error: BaseException) -> list[str]:
    return re.findall(r"skipped `([^`]+)`", str(error))


pytestmark = pytest.mark.anyio  # each backend: asyncio and trio (the property test's own)


async def test_a_launch_reading_a_failed_buffer_is_skipped_and_its_outputs_carry_it(
    client: ac.ComputeClient,
) -> None:
    a, b, c, d = (client.create(np.full(4, 7, np.uint32)) for _ in range(4))
    client.execute(_root(1), ac.CubeCount(1), _on([a]))
    with pytest.raises(FAILED) as root:
        await client.sync()
    RUNS.clear()
    client.execute(ADDS[0], ac.CubeCount(1), _on([a, b, c]))  # a carries: skipped
    client.execute(ADDS[1], ac.CubeCount(1), _on([b, d, c]))  # now b does: skipped
    await client.sync()  # a skip is no new error
    assert RUNS == []  # neither ran (on the host; on CUDA the bytes below tell)
    for h, path in (
        (a, []),
        (b, ["prop_add_0"]),
        (c, ["prop_add_0"]),
        (d, ["prop_add_0", "prop_add_1"]),
    ):
        with pytest.raises(ac.TaintedBuffer) as read:
            await client.read_array(h, np.uint32)
        assert isinstance(read.value, type(root.value)), read.value  # the root's type
        assert "prop_fail_1" in str(read.value) and _path(read.value) == path
    needed = f"skipped `prop_add_1`: it needed memory {b.memory.id}, which carried the failure"
    assert needed in str(read.value)
    _write(client, a, np.arange(4))  # a successful write clears as before
    np.testing.assert_array_equal(await client.read_array(a, np.uint32), np.arange(4))
    with pytest.raises(ac.TaintedBuffer):  # c was never written: it still carries it
        await client.read_array(c, np.uint32)
    for h in (b, c, d):
        _write(client, h, np.full(4, 2))
    client.execute(ADDS[2], ac.CubeCount(1), _on([a, b, c]))  # nothing carries: it runs
    np.testing.assert_array_equal(await client.read_array(c, np.uint32), np.arange(4) + 3)
    assert client._channel._held.failures() == 0


async def test_a_failure_keeps_its_newest_skip_records(client: ac.ComputeClient) -> None:
    chain = [client.create(np.zeros(4, np.uint32)) for _ in range(SKIP_RECORDS + 5)]
    other = client.create(np.zeros(4, np.uint32))
    client.execute(_root(2), ac.CubeCount(1), _on([chain[0]]))
    for k, (src, dst) in enumerate(itertools.pairwise(chain)):
        client.execute(ADDS[k % 3], ac.CubeCount(1), _on([src, other, dst]))
    with pytest.raises(FAILED):
        await client.sync()
    with pytest.raises(ac.TaintedBuffer) as read:
        await client.read_array(chain[-1], np.uint32)
    text = str(read.value)
    assert "prop_fail_2" in text and len(_path(read.value)) == SKIP_RECORDS
    # 20 launches skipped, each giving its output the failure: the newest 16 are kept
    assert f"4 older skip records of this failure dropped: the newest {SKIP_RECORDS}" in text
    assert _path(read.value) == [f"prop_add_{k % 3}" for k in range(4, SKIP_RECORDS + 4)]
    del chain, other


async def test_a_failure_is_freed_with_its_last_carrier(client: ac.ComputeClient) -> None:
    held = client._channel._held
    a, b = client.create(np.zeros(4, np.uint32)), client.create(np.zeros(4, np.uint32))
    c = client.create(np.zeros(4, np.uint32))
    client.execute(_root(3), ac.CubeCount(1), _on([a]))
    client.execute(ADDS[0], ac.CubeCount(1), _on([a, b, c]))
    with pytest.raises(FAILED):
        await client.sync()
    assert held.failures() == 1 and len(held._tainted) == 3
    _write(client, a, np.ones(4))
    await client.sync()
    assert held.failures() == 1  # b and c still carry it
    del b
    await client.memory_usage()  # dropped handles are taken back here
    assert held.failures() == 1 and len(held._tainted) == 1
    del c
    await client.memory_usage()
    assert held.failures() == 0 and not held._tainted  # nothing held once none carries it


# -- the property test -----------------------------------------------------------------

N_BUFFERS, N_STREAMS = 5, 3
_OP = st.one_of(
    st.tuples(st.just("fail"), st.integers(0, N_BUFFERS - 1), st.integers(0, N_STREAMS - 1)),
    st.tuples(
        st.just("launch"),
        st.lists(st.integers(0, N_BUFFERS - 1), min_size=3, max_size=3, unique=True),
        st.integers(0, N_STREAMS - 1),
        st.integers(0, 2),
    ),
    st.tuples(st.just("write"), st.integers(0, N_BUFFERS - 1), st.integers(0, N_STREAMS - 1)),
    st.tuples(st.just("renew"), st.integers(0, N_BUFFERS - 1)),
)


@dataclass
class _Oracle:
    """What each buffer holds: its bytes, or the root failure it descends from and the
    skipped kernels from that root to it; and the errors held per stream."""

    values: list[np.ndarray | None]
    roots: list[int | None] = field(default_factory=lambda: [None] * N_BUFFERS)
    paths: list[list[str]] = field(default_factory=lambda: [[] for _ in range(N_BUFFERS)])
    records: dict[int, int] = field(default_factory=dict)  # root -> its skip records
    held: list[bool] = field(default_factory=lambda: [False] * N_STREAMS)

    def fail(self, buf: int, root: int, stream: int) -> bool:
        if self.roots[buf] is not None:
            return False  # skipped: it binds a buffer that carries a failure
        self.values[buf], self.roots[buf], self.paths[buf] = None, root, []
        self.records[root] = 0
        self.held[stream] = True
        return True

    def launch(self, bufs: list[int], kernel: str) -> None:
        carrier = next((b for b in bufs if self.roots[b] is not None), None)
        if carrier is None:
            a, b = self.values[bufs[0]], self.values[bufs[1]]
            assert a is not None and b is not None
            self.values[bufs[2]] = a + b + np.uint32(1)
            return
        clean = [b for b in bufs if self.roots[b] is None]
        root = self.roots[carrier]
        assert root is not None
        if clean:
            self.records[root] += 1
        for b in clean:
            self.values[b], self.roots[b] = None, root
            self.paths[b] = [*self.paths[carrier], kernel]

    def write(self, buf: int, values: np.ndarray) -> None:
        self.values[buf], self.roots[buf], self.paths[buf] = values, None, []


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(_OP, min_size=1, max_size=24))
def test_failures_reach_exactly_their_descendants(
    device: str, backend: str, ops: list[tuple[object, ...]]
) -> None:
    anyio.run(_scenario, device, ops, backend=backend)


async def _scenario(device: str, ops: list[tuple[object, ...]]) -> None:
    async with ac.open_client(device) as client:
        start = [np.full(4, 10 * i, np.uint32) for i in range(N_BUFFERS)]
        bufs = [client.create(v) for v in start]
        oracle = _Oracle(values=list(start))
        roots = 0
        for step, op in enumerate(ops):
            kind = op[0]
            if kind == "renew":
                buf = int(op[1])  # type: ignore[call-overload]
                bufs[buf] = client.create(np.full(4, step, np.uint32))
                oracle.write(buf, np.full(4, step, np.uint32))
                continue
            with ac.StreamId.pinned(ac.StreamId(60 + int(op[2]))):  # type: ignore[call-overload]
                if kind == "fail":
                    buf = int(op[1])  # type: ignore[call-overload]
                    roots += 1
                    client.execute(_root(roots), ac.CubeCount(1), _on([bufs[buf]]))
                    oracle.fail(buf, roots, int(op[2]))  # type: ignore[call-overload]
                elif kind == "launch":
                    which = list(op[1])  # type: ignore[call-overload]
                    kernel = ADDS[int(op[3])]  # type: ignore[call-overload]
                    client.execute(kernel, ac.CubeCount(1), _on([bufs[i] for i in which]))
                    oracle.launch(which, kernel.id)
                else:
                    buf = int(op[1])  # type: ignore[call-overload]
                    values = np.full(4, 1000 + step, np.uint32)
                    _write(client, bufs[buf], values)
                    oracle.write(buf, values)
        await _check(client, bufs, oracle)
        del bufs
        await client.sync()  # the last read's future lives until the loop's next turn
        await client.memory_usage()  # dropped handles are taken back here
        assert client._channel._held.failures() == 0 and not client._channel._held._tainted


async def _error_of(call: Awaitable[object]) -> tuple[type[BaseException], str]:
    """The type and message of the error ``call`` raises (not the error: its traceback
    holds the caller's frame, and that frame the handles, until a gc). ``call`` is not
    kept as a local while it is awaited: the error's traceback holds this frame, so a
    local awaitable (which holds the error) would make a cycle that only the gc breaks,
    and on Python 3.12+ a frame that outlives its run keeps its caller's frame too
    (``f_back``), with the caller's handles."""
    pending = [call]
    del call
    try:
        await pending.pop()
    except BaseException as exc:
        return type(exc), str(exc)
    raise AssertionError("it did not raise")


async def _check(client: ac.ComputeClient, bufs: list[ac.Handle], oracle: _Oracle) -> None:
    for stream in range(N_STREAMS):
        with ac.StreamId.pinned(ac.StreamId(60 + stream)):
            if oracle.held[stream]:
                kind, _ = await _error_of(client.sync())
                assert issubclass(kind, FAILED) and not issubclass(kind, ac.TaintedBuffer)
            await client.sync()
    await client.memory_usage()  # the handles dropped by "renew" are taken back here
    alive = {r for r in oracle.roots if r is not None}
    assert client._channel._held.failures() == len(alive) <= N_BUFFERS
    for buf, h in enumerate(bufs):
        root, expected = oracle.roots[buf], oracle.values[buf]
        if root is None:
            assert expected is not None
            np.testing.assert_array_equal(await client.read_array(h, np.uint32), expected)
            continue
        kind, text = await _error_of(client.read_array(h, np.uint32))
        assert issubclass(kind, ac.TaintedBuffer) and issubclass(kind, FAILED), text
        assert re.search(rf"prop_fail_{root}\b", text), text  # the root's type and name
        if oracle.records[root] <= SKIP_RECORDS:
            assert re.findall(r"skipped `([^`]+)`", text) == oracle.paths[buf], text


# -- the error a carrier's read raises ---------------------------------------------------


def test_a_carried_error_is_of_the_roots_type_and_pickles() -> None:
    import pickle

    from asynccube._core.errors import CudaDriverError, carried_error

    for root in (ac.ExecutionError, ac.BufferTooBig, ac.InvalidArgument, CudaDriverError):
        error = carried_error(root, f"buffer 1 carries a {root.__name__}")
        assert isinstance(error, ac.TaintedBuffer) and isinstance(error, root)
        assert str(error) == f"buffer 1 carries a {root.__name__}"
        assert type(error).__module__ == "asynccube"
        assert type(error) is type(carried_error(root, "again"))  # one class per root
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error)
    for root in (RuntimeError, ac.TaintedBuffer):  # not asynccube's, or a taint already
        assert type(carried_error(root, "x")) is ac.TaintedBuffer


async def test_a_graph_replay_binding_a_carrier_is_skipped_and_its_writes_carry_it(
    client: ac.ComputeClient,
) -> None:
    """A replayed graph is one command: when a buffer one of its launches binds carries
    a failure, the replay is skipped whole, and every buffer its launches bind (which
    the replay would have written) carries the failure, each launch of the graph named
    where a carrier reached it; a write clears as for a launch."""
    a, b, c = (client.create(np.full(4, 7, np.uint32)) for _ in range(3))
    d = client.create(np.zeros(4, np.uint32))
    async with client.capture() as graph:
        client.execute(ADDS[0], ac.CubeCount(1), _on([a, b, c]))  # c = a + b + 1
        client.execute(ADDS[1], ac.CubeCount(1), _on([c, b, d]))  # d = c + b + 1
    graph.replay()
    np.testing.assert_array_equal(await client.read_array(d, np.uint32), np.full(4, 23))
    client.execute(_root(7), ac.CubeCount(1), _on([a]))
    with pytest.raises(FAILED):
        await client.sync()
    RUNS.clear()
    graph.replay()  # a carries the failure: nothing of the graph runs
    await client.sync()  # a skip is no new error
    assert RUNS == []
    for h, path in ((b, ["prop_add_0"]), (c, ["prop_add_0"]), (d, ["prop_add_0", "prop_add_1"])):
        kind, text = await _error_of(client.read_array(h, np.uint32))
        assert issubclass(kind, ac.TaintedBuffer) and issubclass(kind, FAILED), text
        assert "prop_fail_7" in text and re.findall(r"skipped `([^`]+)`", text) == path, text
    for h in (a, b, c, d):
        _write(client, h, np.full(4, 1))
    graph.replay()  # nothing carries it any more: the graph runs again
    np.testing.assert_array_equal(await client.read_array(d, np.uint32), np.full(4, 5))
    assert client._channel._held.failures() == 0
    del graph  # its launches hold their buffers until it is dropped
    await client.sync()
