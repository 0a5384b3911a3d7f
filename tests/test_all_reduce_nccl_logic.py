"""``all_reduce``'s NCCL path without a GPU: the library search, the ctypes wrapper's
error mapping, the communicator cache, the grouped issue, and the client-side sequence
(host clients standing in for CUDA ones, a fake library and fake CUDA side)."""

from __future__ import annotations

import asyncio
import os
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asynccube as ac
from asynccube._core.client import collective as client_collective
from asynccube._core.client import nccl_reduce
from asynccube._core.cuda import collective, nccl

ERRORS = {0: "no error", 3: "internal error", 5: "invalid usage"}


class FakeCdll:
    """Stands in for ``ctypes.CDLL(libnccl.so.2)``: each call returns a result code."""

    def __init__(self, fail: dict[str, int] | None = None) -> None:
        self.calls: list[str] = []
        fail = fail or {}
        for name in (
            "ncclGetVersion",
            "ncclCommInitAll",
            "ncclCommDestroy",
            "ncclGroupStart",
            "ncclGroupEnd",
            "ncclAllReduce",
            "ncclBroadcast",
            "ncclAllGather",
            "ncclReduceScatter",
        ):
            setattr(self, name, self._fn(name, fail.get(name, 0)))
        self.ncclGetErrorString = lambda code: ERRORS.get(code, "?").encode()

    def _fn(self, name: str, code: int) -> Any:
        def call(*args: Any) -> int:
            self.calls.append(name)
            return code

        return call


class FakeLib:
    """Stands in for :class:`nccl.Nccl` (the methods ``collective`` calls)."""

    def __init__(self, fail_at: int | None = None, end_fails: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail_at, self.end_fails = fail_at, end_fails
        self.destroyed: list[int] = []

    def comm_init_all(self, devices: list[int]) -> list[int]:
        self.calls.append(("init", tuple(devices)))
        return [100 + d for d in devices]

    def comm_destroy(self, comm: int) -> None:
        self.destroyed.append(comm)

    def group_start(self) -> None:
        self.calls.append(("start",))

    def group_end(self) -> None:
        self.calls.append(("end",))
        if self.end_fails:
            raise nccl.error(self, 3, "ncclGroupEnd")

    def all_reduce(self, ptr: int, count: int, dtype: int, op: int, comm: int, stream: int) -> None:
        self.calls.append(("all_reduce", ptr, count, dtype, op, comm, stream))
        if (
            self.fail_at is not None
            and sum(c[0] == "all_reduce" for c in self.calls) > self.fail_at
        ):
            raise nccl.error(self, 5, "ncclAllReduce")

    def error_string(self, code: int) -> str:
        return ERRORS.get(code, "?")


class FakeServer:
    """What ``cuda.collective`` reads of a CUDA server (weakly referenced)."""

    def __init__(self, ordinal: int) -> None:
        self.context = types.SimpleNamespace(ordinal=ordinal)
        self.close_hooks: list[Any] = []


def fake_server(ordinal: int) -> Any:
    return FakeServer(ordinal)


# -- finding and loading the library --------------------------------------------------


def test_the_environment_variable_comes_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(nccl.ENV_LIBRARY, "/opt/mine/libnccl.so.2")
    nccl.forget_search()
    try:
        assert nccl.find_library() == "/opt/mine/libnccl.so.2"
    finally:
        nccl.forget_search()


def test_the_wheel_is_found_before_the_system(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    lib = tmp_path / "nvidia" / "nccl" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnccl.so.2").write_bytes(b"")
    spec = types.SimpleNamespace(submodule_search_locations=[str(tmp_path / "nvidia")])
    monkeypatch.delenv(nccl.ENV_LIBRARY, raising=False)
    monkeypatch.setattr(nccl.importlib.util, "find_spec", lambda name: spec)
    system = tmp_path / "system"
    system.mkdir()
    (system / "libnccl.so.2").write_bytes(b"")
    monkeypatch.setenv("LD_LIBRARY_PATH", f"/nowhere{os.pathsep}{system}")
    monkeypatch.setattr(nccl, "SYSTEM_DIRS", ())
    monkeypatch.setattr(nccl.sysconfig, "get_config_var", lambda name: None)
    nccl.forget_search()
    try:
        assert nccl.find_library() == str(lib / "libnccl.so.2")
        (lib / "libnccl.so.2").unlink()
        nccl.forget_search()
        assert nccl.find_library() == str(system / "libnccl.so.2")
        (system / "libnccl.so.2").unlink()
        nccl.forget_search()
        assert nccl.find_library() is None
    finally:
        nccl.forget_search()


def test_the_search_runs_no_subprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    """The search runs on the loop: paths only (``ctypes.util.find_library`` would run
    ``ldconfig`` or a compiler, milliseconds and more)."""
    import subprocess

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the NCCL search started a subprocess")

    monkeypatch.delenv(nccl.ENV_LIBRARY, raising=False)
    monkeypatch.setattr(nccl.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    nccl.forget_search()
    try:
        nccl.find_library()  # found or not, without a subprocess
    finally:
        nccl.forget_search()


def test_a_library_that_does_not_load_is_a_typed_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    with pytest.raises(ac.CollectiveError, match="cannot load the NCCL library"):
        nccl.load(str(tmp_path / "libnccl.so.2"))
    assert os.environ["NCCL_NVLS_ENABLE"] == "0"  # multicast off before any communicator


def test_the_wrapper_names_nccls_error_string() -> None:
    cdll = FakeCdll(fail={"ncclAllReduce": 5, "ncclGroupEnd": 3})
    lib = nccl.Nccl(cdll, "fake")
    lib.group_start()
    assert lib.comm_init_all([0, 1]) == [0, 0]
    with pytest.raises(
        ac.CollectiveError, match=r"ncclAllReduce failed: invalid usage \(ncclResult_t 5\)"
    ):
        lib.all_reduce(1, 2, 7, 0, 3, 4)
    with pytest.raises(ac.CollectiveError, match="ncclGroupEnd failed: internal error"):
        lib.group_end()
    assert cdll.calls == ["ncclGroupStart", "ncclCommInitAll", "ncclAllReduce", "ncclGroupEnd"]


# -- communicators and the grouped issue ----------------------------------------------


def test_communicators_are_cached_and_destroyed_when_a_server_closes() -> None:
    lib = FakeLib()
    a, b = fake_server(1), fake_server(0)
    comms = collective.init_job("fake", [a, b], loader=lambda path: lib)()
    assert lib.calls == [("init", (1, 0))]
    assert collective.cached([a, b]) is comms and collective.cached([b, a]) is None
    assert collective.init_job("fake", [a, b], loader=lambda path: lib)() is comms
    assert len(lib.calls) == 1  # made once
    b.close_hooks[0]()  # b's close thread
    assert sorted(lib.destroyed) == [100, 101]
    assert collective.cached([a, b]) is None
    a.close_hooks[0]()  # closing a too destroys nothing twice
    assert sorted(lib.destroyed) == [100, 101]


def test_issue_groups_every_device_and_always_closes_the_group() -> None:
    servers = [fake_server(0), fake_server(1)]
    lib = FakeLib()
    comms = collective.Comms(lib, servers, [10, 11])
    sides = [(servers[0], (0xA0, 5)), (servers[1], (0xB0, 6))]
    collective.issue(comms, sides, 8, "float16", "max")
    assert lib.calls == [
        ("start",),
        ("all_reduce", 0xA0, 8, 6, 2, 10, 5),
        ("all_reduce", 0xB0, 8, 6, 2, 11, 6),
        ("end",),
    ]
    failing = FakeLib(fail_at=1, end_fails=True)
    comms = collective.Comms(failing, servers, [10, 11])
    with pytest.raises(ac.CollectiveError, match="invalid usage") as raised:
        collective.issue(comms, sides, 8, "int32", "sum")
    assert failing.calls[-1] == ("end",)  # closed even after a failure
    assert any("ncclGroupEnd failed" in n for n in raised.value.__notes__)


# -- the client-side sequence, with host clients standing in ---------------------------


class FakeCuda:
    """The client path's view of ``cuda.collective``, recording the order of calls."""

    def __init__(self, lib: FakeLib, cached: bool = True, fail_issue: bool = False) -> None:
        self.lib, self.events = lib, []  # type: ignore[var-annotated]
        self.comms: Any = None
        self._cached, self.fail_issue = cached, fail_issue

    def prepare(self, server: Any, binding: Any, stream: Any) -> tuple[int, int]:
        self.events.append(("prepare", server.device))
        return 0x1000, 7

    def cached(self, servers: list[Any]) -> Any:
        if self._cached and self.comms is None:
            self.comms = collective.Comms(self.lib, servers, [1, 2])
        return self.comms

    def init_job(self, path: str, servers: list[Any]) -> Any:
        def job() -> Any:
            self.events.append(("init", path))
            self.comms = collective.Comms(self.lib, servers, [1, 2])
            return self.comms

        return job

    def issue(self, comms: Any, sides: Any, count: int, dtype: str, op: str) -> None:
        self.events.append(("issue", count, dtype, op))
        if self.fail_issue:
            raise nccl.error(self.lib, 3, "ncclGroupEnd")

    def finish(self, server: Any, side: Any, binding: Any) -> None:
        self.events.append(("finish", server.device))


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Any:
    def install(fake: FakeCuda) -> FakeCuda:
        monkeypatch.setattr(nccl_reduce, "_cuda", lambda: fake)
        monkeypatch.setattr(client_collective, "_nccl_path", lambda pairs, dtype: "libfake.so")
        return fake

    return install


@pytest.mark.asyncio
@pytest.mark.parametrize("cached", [True, False])
async def test_the_nccl_sequence_on_every_client(fake_cuda: Any, cached: bool) -> None:
    fake = fake_cuda(FakeCuda(FakeLib(), cached=cached))
    async with ac.open_client("host") as c0, ac.open_client("host") as c1:
        h0, h1 = c0.create(bytes(16)), c1.create(bytes(16))
        await ac.all_reduce([(c0, h0), (c1, h1)], "float32", op="min")
        names = [e[0] for e in fake.events]
        init = [] if cached else ["init"]
        assert names == ["prepare", "prepare", *init, "issue", "finish", "finish"]
        assert ("issue", 4, "float32", "min") in fake.events


@pytest.mark.asyncio
async def test_a_failed_issue_is_held_on_every_client_and_taints_the_buffers(
    fake_cuda: Any,
) -> None:
    fake_cuda(FakeCuda(FakeLib(), fail_issue=True))
    async with ac.open_client("host") as c0, ac.open_client("host") as c1:
        h0, h1 = c0.create(bytes(16)), c1.create(bytes(16))
        with pytest.raises(ac.CollectiveError, match="may have changed") as raised:
            await ac.all_reduce([(c0, h0), (c1, h1)], "int32")
        assert isinstance(raised.value.__cause__, ac.CollectiveError)  # NCCL's, named
        assert "internal error" in str(raised.value)
        for c, h in ((c0, h0), (c1, h1)):
            await c.sync()  # taken by the await above: raised once
            with pytest.raises(ac.TaintedBuffer):
                await c.read([h])
            c.write([(h.copy_descriptor((16,), (1,), 1), np.ones(4, np.int32))])
            assert await c.read_array(h, np.int32) is not None  # serving, clean again


@pytest.mark.asyncio
async def test_a_tainted_buffer_is_refused_before_nccl_runs(fake_cuda: Any) -> None:
    fake = fake_cuda(FakeCuda(FakeLib()))
    async with ac.open_client("host") as c0, ac.open_client("host") as c1:
        h0, h1 = c0.create(bytes(16)), c1.create(bytes(16))
        c1._channel._held.taint([h1.memory.id], RuntimeError("earlier failure"))
        with pytest.raises(ac.CollectiveError, match="unchanged"):
            await ac.all_reduce([(c0, h0), (c1, h1)], "int32")
        assert [e[0] for e in fake.events] == ["prepare"]  # c1 refused; nothing issued
        await asyncio.gather(c0.sync(), c1.sync())
