"""A fake NCCL for the collectives' client paths without a GPU: a library recording
every call (and the thread it came from), optionally slow or failing, and the client
path's view of ``cuda.collective`` with the real grouping and issue thread but fake
CUDA sides (host clients stand in for CUDA ones)."""

from __future__ import annotations

import threading
import time
from typing import Any

from asynccube._core.cuda import collective, nccl

ERRORS = {0: "no error", 3: "internal error", 5: "invalid usage"}
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")


class SlowLib:
    """Stands in for :class:`nccl.Nccl`: records ``(call, *args)`` in ``calls`` and the
    calling threads in ``threads``; ``group_end`` sleeps ``end_sleep`` seconds (NCCL
    connecting, or its launch queue full); ``fail``: the name of a collective call that
    raises NCCL's "invalid usage"."""

    def __init__(self, end_sleep: float = 0.0, fail: str | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.threads: set[int] = set()
        self.end_sleep, self.fail = end_sleep, fail
        self.destroyed: list[int] = []
        for name in COLLECTIVES:
            setattr(self, name, self._call(name))

    def _record(self, *call: Any) -> None:
        self.threads.add(threading.get_ident())
        self.calls.append(call)

    def _call(self, name: str) -> Any:
        def call(*args: Any) -> None:
            self._record(name, *args)
            if self.fail == name:
                raise nccl.error(self, 5, "nccl" + name)

        return call

    def comm_init_all(self, devices: list[int]) -> list[int]:
        self._record("init", tuple(devices))
        return [100 + d for d in devices]

    def comm_destroy(self, comm: int) -> None:
        self.destroyed.append(comm)

    def group_start(self) -> None:
        self._record("start")

    def group_end(self) -> None:
        if self.end_sleep:
            time.sleep(self.end_sleep)
        self._record("end")

    def error_string(self, code: int) -> str:
        return ERRORS.get(code, "?")

    def collective_calls(self) -> list[tuple[Any, ...]]:
        """The recorded collective calls, in order (no group marks)."""
        return [c for c in self.calls if c[0] in COLLECTIVES]


def side(binding: Any) -> int:
    """The fake device address of a binding (its slice id, shifted)."""
    return 0x1000 + binding.memory.id


class FakeCuda:
    """The client path's view of ``cuda.collective``: the real group, issue functions
    and communicator sets (with their issue threads) over ``lib``; fake sides (a
    binding's address is :func:`side`, the stream 7), made at once (``cached``)."""

    def __init__(self, lib: SlowLib) -> None:
        self.lib = lib
        self.comms: dict[tuple[int, ...], Any] = {}
        self.finished: list[tuple[str, int]] = []
        self.prepared_on: set[int] = set()
        for name in ("issue", "group", "broadcast", "all_gather", "reduce_scatter"):
            if hasattr(collective, name):
                setattr(self, name, getattr(collective, name))

    def prepare(self, server: Any, bindings: Any, stream: Any) -> tuple[int, ...]:
        self.prepared_on.add(threading.get_ident())
        if not isinstance(bindings, (list, tuple)):  # (main's: one binding)
            bindings = [bindings]
        return (side(bindings[0]), 7, *(side(b) for b in bindings[1:]))

    def cached(self, servers: list[Any]) -> Any:
        key = tuple(id(s) for s in servers)
        if key not in self.comms:
            self.comms[key] = collective.Comms(
                self.lib, servers, [100 + i for i in range(len(servers))]
            )
        return self.comms[key]

    def init_job(self, path: str, servers: list[Any]) -> Any:
        return lambda: self.cached(servers)

    def finish(self, server: Any, side: Any, bindings: Any) -> None:
        self.finished.append((server.device, side[0]))

    def destroy(self) -> None:
        """Free every communicator set (blocking: a test's teardown, off the loop)."""
        for comms in self.comms.values():
            comms.destroy()
