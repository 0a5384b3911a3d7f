"""``all_reduce`` over NCCL between CUDA servers of distinct devices (one process).

One communicator set per set of servers (``ncclCommInitAll`` over their devices, in a
worker thread: it blocks), cached, and destroyed when any of those servers closes (its
close thread runs :data:`close hooks <CLOSE_HOOKS>`), or at exit. Each server's side
is resolved the way a kernel's is (:meth:`prepare`: its stream waits for the buffer's
earlier work on other streams); the reductions of all devices are then issued at once
under ``ncclGroupStart``/``ncclGroupEnd`` (:func:`issue`), each on its server's stream,
so later work queued on those streams runs after them; each buffer is held until its
stream passes the reduction (:func:`finish`).
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..values.stream_id import StreamId
from ..values.types import Binding
from . import nccl
from .driver import forget_current

if TYPE_CHECKING:
    from .server import CudaServer

__all__ = ["Comms", "cached", "finish", "init_job", "issue", "prepare"]

Side = tuple[int, Any]
"""(device address of the buffer, the server's CUDA stream for the caller's stream)."""


class Comms:
    """The communicators of one set of servers: the library and one per server."""

    def __init__(self, lib: Any, servers: Sequence[Any], comms: list[int]) -> None:
        self.lib = lib
        self._servers = [weakref.ref(s) for s in servers]
        self.by_server = {id(s): c for s, c in zip(servers, comms, strict=True)}
        self.destroyed = False

    def serves(self, servers: Sequence[Any]) -> bool:
        """True while these exact servers are the ones it was made for."""
        return not self.destroyed and [r() for r in self._servers] == list(servers)

    def destroy(self) -> None:
        """Free every communicator (once; blocking: the close thread, or exit)."""
        if self.destroyed:
            return
        self.destroyed = True
        first: BaseException | None = None
        for comm in self.by_server.values():
            try:
                self.lib.comm_destroy(comm)
            except Exception as exc:  # free the others still; the first is raised
                first = first or exc
        if first is not None:
            raise first


_lock = threading.Lock()
_cache: dict[tuple[int, ...], Comms] = {}
_exit_registered: list[bool] = []


def _key(servers: Sequence[Any]) -> tuple[int, ...]:
    return tuple(id(s) for s in servers)


def cached(servers: Sequence[Any]) -> Comms | None:
    """The communicators made for ``servers`` (in this order), or None."""
    comms = _cache.get(_key(servers))
    return comms if comms is not None and comms.serves(servers) else None


def init_job(path: str, servers: Sequence[CudaServer], loader: Any = None) -> Callable[[], Comms]:
    """A job (for a worker thread) that loads NCCL from ``path`` (``loader``: tests'
    fake) and makes one communicator per server's device, cached for ``servers``."""
    load = nccl.load if loader is None else loader
    devices = [s.context.ordinal for s in servers]

    def job() -> Comms:
        with _lock:
            comms = cached(servers)
            if comms is not None:
                return comms
            lib = load(path)
            try:
                made = Comms(lib, servers, lib.comm_init_all(devices))
            finally:
                forget_current()  # NCCL made each device current in this thread
            _cache[_key(servers)] = made
            for server in servers:
                server.close_hooks.append(_forget_hook(made))
            if not _exit_registered:
                _exit_registered.append(True)
                atexit.register(destroy_all)
            return made

    return job


def _forget_hook(comms: Comms) -> Callable[[], None]:
    def hook() -> None:
        with _lock:
            for key, value in list(_cache.items()):
                if value is comms:
                    del _cache[key]
        comms.destroy()

    return hook


def destroy_all() -> None:
    """Free every cached communicator (at exit)."""
    with _lock:
        every = list(_cache.values())
        _cache.clear()
    for comms in every:
        try:
            comms.destroy()
        except Exception:  # at exit: the driver may be gone already; nothing to do
            pass


def prepare(server: CudaServer, binding: Binding, stream: StreamId) -> Side:
    """One server's side, issued like a kernel: the buffer's address, and the server's
    stream for ``stream``, made to wait for the buffer's work on other streams."""
    ptr = server._ptr(binding)
    resolved = server._streams.resolve(stream, [binding])
    return ptr, resolved.stream


def issue(comms: Comms, sides: Sequence[tuple[Any, Side]], count: int, dtype: str, op: str) -> None:
    """Every device's ``ncclAllReduce`` (in place), in one NCCL group: ``sides`` pairs
    each server with its :func:`prepare` result. The group is always closed; the
    first failure is raised (:class:`~asynccube.CollectiveError`, NCCL's words)."""
    lib = comms.lib
    code, reduce_op = nccl.DTYPES[dtype], nccl.OPS[op]
    lib.group_start()
    failed: BaseException | None = None
    try:
        for server, (ptr, stream) in sides:
            lib.all_reduce(ptr, count, code, reduce_op, comms.by_server[id(server)], int(stream))
    except BaseException as exc:
        failed = exc
    try:
        lib.group_end()
    except BaseException as exc:
        forget_current()
        if failed is None:
            raise
        failed.add_note(f"and then ncclGroupEnd failed: {exc}")
    forget_current()  # NCCL made each device current in turn: the caller activates again
    if failed is not None:
        raise failed


def finish(server: CudaServer, side: Side, binding: Binding) -> None:
    """After the group: the buffer stays alive until its stream passes the reduction."""
    server._retirer.hold(side[1], binding)
