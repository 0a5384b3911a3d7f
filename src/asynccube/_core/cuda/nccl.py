"""NCCL, loaded at run time with ctypes (no build-time dependency): where the library
is found, and a thin wrapper over the few calls the collectives make (``all_reduce``,
``broadcast``, ``all_gather``, ``reduce_scatter``).

The library is looked for, in order: the file named by ``ASYNCCUBE_NCCL_LIBRARY``; the
``nvidia-nccl-cu13`` / ``nvidia-nccl-cu12`` wheels' ``nvidia/nccl/lib/libnccl.so.2``
(the one PyTorch's wheels bring); then the system's (``libnccl.so.2`` in the
directories of ``LD_LIBRARY_PATH`` and the usual system ones). Finding it only looks at
paths (cached; no ``ldconfig`` subprocess, it runs on the loop); loading it
(``dlopen``) happens in a worker thread, with the first communicator.

NVLink multicast (NVLS) stays off: ``NCCL_NVLS_ENABLE=0`` is set in ``os.environ``
before the first communicator, unless the user set it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sysconfig
import threading
from typing import Any, Final

from ..errors import CollectiveError

__all__ = ["DTYPES", "ENV_LIBRARY", "OPS", "Nccl", "find_library", "load"]

ENV_LIBRARY: Final = "ASYNCCUBE_NCCL_LIBRARY"
"""The environment variable naming the NCCL library to load (a path)."""

DTYPES: Final[dict[str, int]] = {
    "int8": 0,
    "uint8": 1,
    "int32": 2,
    "uint32": 3,
    "int64": 4,
    "uint64": 5,
    "float16": 6,
    "float32": 7,
    "float64": 8,
}
"""numpy dtype name -> ``ncclDataType_t`` (NCCL has no 16-bit integers: those take the
staged path)."""

OPS: Final[dict[str, int]] = {"sum": 0, "prod": 1, "max": 2, "min": 3}
"""Reduction name -> ``ncclRedOp_t``."""

_SUCCESS: Final = 0
_NOT_FOUND: Final = ""
_lock = threading.Lock()
_found: list[str] = []
_loaded: dict[str, Nccl] = {}


def find_library() -> str | None:
    """The path of the NCCL library to load, or None where there is none (cached)."""
    if not _found:
        _found.append(_search() or _NOT_FOUND)
    return _found[0] or None


def forget_search() -> None:
    """Look for the library again next time (tests; after installing a wheel)."""
    _found.clear()


def _search() -> str | None:
    named = os.environ.get(ENV_LIBRARY)
    if named:
        return named  # the user's choice: a wrong path fails when loaded, naming it
    for path in _wheel_candidates() + _system_candidates():
        if os.path.exists(path):
            return path
    return None


SYSTEM_DIRS: Final = ("/usr/local/cuda/lib64", "/usr/lib64", "/usr/lib", "/usr/local/lib", "/lib")
"""Where a system's NCCL lives (after ``LD_LIBRARY_PATH``; the multiarch directory of
``/usr/lib`` and ``/lib`` first, as the dynamic loader looks)."""


def _system_candidates() -> list[str]:
    """``libnccl.so.2`` (then ``libnccl.so``) in ``LD_LIBRARY_PATH``'s directories and
    the system's (paths only: ``ctypes.util.find_library`` would run ``ldconfig``)."""
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    arch = sysconfig.get_config_var("MULTIARCH")
    if arch:
        dirs += [f"/usr/lib/{arch}", f"/lib/{arch}"]
    dirs += list(SYSTEM_DIRS)
    return [os.path.join(d, name) for name in ("libnccl.so.2", "libnccl.so") for d in dirs]


def _wheel_candidates() -> list[str]:
    """``nvidia/nccl/lib/libnccl.so.2`` under each entry of the ``nvidia`` namespace
    package's search path (found without importing anything heavy)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [
        os.path.join(str(root), "nccl", "lib", "libnccl.so.2")
        for root in spec.submodule_search_locations
    ]


def load(path: str) -> Nccl:
    """The library at ``path``, loaded once (blocking: call it in a worker thread)."""
    with _lock:
        lib = _loaded.get(path)
        if lib is None:
            if "NCCL_NVLS_ENABLE" not in os.environ:
                os.environ["NCCL_NVLS_ENABLE"] = "0"  # never NVLink multicast
            try:
                cdll = ctypes.CDLL(path)
            except OSError as exc:
                raise CollectiveError(
                    f"cannot load the NCCL library {path!r}: {exc}; install the "
                    f"nvidia-nccl-cu12/-cu13 wheel or set {ENV_LIBRARY} to libnccl.so.2"
                ) from exc
            lib = _loaded[path] = Nccl(cdll, path)
        return lib


class Nccl:
    """The NCCL calls the collectives make, each checked: a failure raises
    :class:`CollectiveError` naming the call and NCCL's error string. Tests pass an
    object with the same methods instead (a fake library)."""

    def __init__(self, cdll: Any, path: str) -> None:
        self.path = path
        self._lib = cdll
        c_int, c_void_p, c_size_t = ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t
        _sig(cdll.ncclGetVersion, [ctypes.POINTER(c_int)])
        _sig(cdll.ncclCommInitAll, [ctypes.POINTER(c_void_p), c_int, ctypes.POINTER(c_int)])
        _sig(cdll.ncclCommDestroy, [c_void_p])
        _sig(cdll.ncclGroupStart, [])
        _sig(cdll.ncclGroupEnd, [])
        _sig(
            cdll.ncclAllReduce,
            [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p],
        )
        _sig(
            cdll.ncclBroadcast,
            [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p],
        )
        _sig(cdll.ncclAllGather, [c_void_p, c_void_p, c_size_t, c_int, c_void_p, c_void_p])
        _sig(
            cdll.ncclReduceScatter,
            [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p],
        )
        cdll.ncclGetErrorString.restype = ctypes.c_char_p
        cdll.ncclGetErrorString.argtypes = [c_int]

    def version(self) -> int:
        """NCCL's version code (e.g. 22703 for 2.27.3)."""
        out = ctypes.c_int()
        self._check(self._lib.ncclGetVersion(ctypes.byref(out)), "ncclGetVersion")
        return out.value

    def comm_init_all(self, devices: list[int]) -> list[int]:
        """One communicator per device of ``devices`` (blocking: a worker thread)."""
        n = len(devices)
        comms = (ctypes.c_void_p * n)()
        devlist = (ctypes.c_int * n)(*devices)
        self._check(self._lib.ncclCommInitAll(comms, n, devlist), "ncclCommInitAll")
        return [int(c or 0) for c in comms]

    def comm_destroy(self, comm: int) -> None:
        """Free a communicator."""
        self._check(self._lib.ncclCommDestroy(ctypes.c_void_p(comm)), "ncclCommDestroy")

    def group_start(self) -> None:
        """``ncclGroupStart``."""
        res = self._lib.ncclGroupStart()
        if res:
            raise error(self, res, "ncclGroupStart")

    def group_end(self) -> None:
        """``ncclGroupEnd``: the grouped calls are queued on their streams."""
        res = self._lib.ncclGroupEnd()
        if res:
            raise error(self, res, "ncclGroupEnd")

    # The collectives pass plain ints: the ``c_void_p`` argtypes convert them (no
    # ``c_void_p`` object made per argument, no call to check a success).

    def all_reduce(self, ptr: int, count: int, dtype: int, op: int, comm: int, stream: int) -> None:
        """``ncclAllReduce`` in place (send = recv = ``ptr``) on ``stream``."""
        res = self._lib.ncclAllReduce(ptr, ptr, count, dtype, op, comm, stream)
        if res:
            raise error(self, res, "ncclAllReduce")

    def broadcast(
        self, send: int, recv: int, count: int, dtype: int, root: int, comm: int, stream: int
    ) -> None:
        """``ncclBroadcast`` of ``count`` elements from rank ``root``'s ``send`` into
        every rank's ``recv`` (in place where they are equal) on ``stream``."""
        res = self._lib.ncclBroadcast(send, recv, count, dtype, root, comm, stream)
        if res:
            raise error(self, res, "ncclBroadcast")

    def all_gather(
        self, send: int, recv: int, count: int, dtype: int, comm: int, stream: int
    ) -> None:
        """``ncclAllGather``: ``count`` elements of each rank's ``send`` land at
        ``rank * count`` of every rank's ``recv``, on ``stream``."""
        res = self._lib.ncclAllGather(send, recv, count, dtype, comm, stream)
        if res:
            raise error(self, res, "ncclAllGather")

    def reduce_scatter(
        self, send: int, recv: int, count: int, dtype: int, op: int, comm: int, stream: int
    ) -> None:
        """``ncclReduceScatter``: rank i's ``recv`` (``count`` elements) gets the
        reduction of chunk i of every rank's ``send``, on ``stream``."""
        res = self._lib.ncclReduceScatter(send, recv, count, dtype, op, comm, stream)
        if res:
            raise error(self, res, "ncclReduceScatter")

    def error_string(self, code: int) -> str:
        """NCCL's words for ``code``."""
        text = self._lib.ncclGetErrorString(code)
        return text.decode(errors="replace") if text else f"ncclResult_t {code}"

    def _check(self, code: int, call: str) -> None:
        if code != _SUCCESS:
            raise error(self, code, call)


def error(lib: Any, code: int, call: str) -> CollectiveError:
    """The error for ``call`` returning ``code`` (NCCL's error string named)."""
    return CollectiveError(
        f"{call} failed: {lib.error_string(code)} (ncclResult_t {code}); NCCL_DEBUG=WARN "
        "in the environment makes NCCL say more"
    )


def _sig(fn: Any, argtypes: list[Any]) -> None:
    fn.restype = ctypes.c_int
    fn.argtypes = argtypes
