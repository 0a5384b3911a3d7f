"""The CUDA hot path, chosen once at import: the compiled module (``_native.c``) or its
pure-Python twin (:mod:`._twin`), which have the same functions and the same behaviour.

* ``ASYNCCUBE_NO_EXTENSIONS=1`` (any value but ``""`` and ``"0"``) forces the twin, as
  in aiohttp and yarl;
* otherwise the compiled module is used when it imports (``pip install .`` builds it
  where a C compiler and Python's headers are present; a failed build only warns);
* else the twin, and :data:`REASON` says why.

``python -m asynccube info`` prints :data:`ACTIVE` and :data:`REASON`.

The module holds mechanism, not policy: the server calls it with driver handles (or
their integer values), addresses and pre-packed argument blocks; each call returns the
driver's ``CUresult`` and the server decides what an error means. Types, integer ranges
and the sizes of argument blocks and values are checked (``InvalidArgument``); driver
handles and raw addresses are trusted, as in cuda.bindings. Neither variant runs
Python in a driver thread: completions are signalled by a C host function (libc's
``close`` in the twin, a C function in the compiled module) closing a pipe's write end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, cast

from ...extensions import compiled

__all__ = ["ACTIVE", "REASON", "HotPath", "hot", "load", "poll_events"]

_NOT_READY = 600  # CUDA_ERROR_NOT_READY


class HotPath(Protocol):
    """What both variants provide (see ``_native.h`` and its parts for each function's contract)."""

    PackState: Any
    FastLaunch: Any

    def open_driver(self) -> None: ...
    def driver_open(self) -> bool: ...
    def launch(
        self,
        state: Any,
        function: Any,
        gx: int,
        gy: int,
        gz: int,
        bx: int,
        by: int,
        bz: int,
        shared: int,
        stream: Any,
        pointers: Sequence[int],
        scalars: Sequence[Any] | None,
        metadata: Any,
        tensor_maps: Sequence[bytes] | None,
    ) -> Any: ...
    def event_record(self, event: Any, stream: Any) -> Any: ...
    def event_query(self, event: Any) -> Any: ...
    def stream_query(self, stream: Any) -> Any: ...
    def stream_check(self, stream: Any) -> tuple[int, int, int, int]: ...
    def ctx_set(self, context: Any) -> Any: ...
    def stream_wait_event(self, stream: Any, event: Any) -> Any: ...
    def memcpy_async(
        self, to_device: bool, device: int, host: int, nbytes: int, stream: Any
    ) -> Any: ...
    def memcpy_peer(
        self, dst: int, dst_context: Any, src: int, src_context: Any, nbytes: int, stream: Any
    ) -> Any: ...
    def notify_close(self, stream: Any, fd: int) -> int: ...
    def notify_spin(self, stream: Any, fd: int, spin_ns: int) -> int: ...
    def notify_drain(self, timeout: float) -> bool: ...
    def param_sizes(self, function: Any) -> tuple[Any, tuple[int, ...] | None] | None: ...
    def is_pinned(self, address: int) -> bool: ...
    def address(self, data: Any) -> int: ...
    def copy_into(self, dst: Any, src: Any, threads: int) -> None: ...
    def copy_stats(self) -> tuple[int, int]: ...
    def bytes_at(self, address: int, nbytes: int, threads: int) -> bytes: ...


def load(no_extensions: bool | None = None) -> tuple[HotPath, str, str]:
    """``(module, "native" | "python", reason)``: the variant to use. The twin is
    imported only where it is used: its modules are about 10 ms of import, which the
    first ``open_client`` of a process runs in a worker thread, holding the GIL (the
    loop waits for it meanwhile)."""
    native, reason = compiled("asynccube._core.cuda.native._native", no_extensions)
    if native is None:
        from . import _twin

        return cast(HotPath, _twin), "python", reason
    return cast(HotPath, native), "native", reason


_chosen = load()
hot: Final[HotPath] = _chosen[0]
"""The variant in use."""
ACTIVE: Final[str] = _chosen[1]
"""``"native"`` or ``"python"``."""
REASON: Final[str] = _chosen[2]
"""Why that variant is in use."""


def poll_events(query: Callable[[Any], Any], events: Sequence[Any], seconds: float) -> int:
    """Poll each of ``events`` in turn with ``query`` (``hot.event_query``: valid from any
    context) for up to ``seconds`` in all: 0 once all are reached, else the last status
    (``CUDA_ERROR_NOT_READY`` once the time ran out, or an event's error). The clock is
    read only once a look finds one not ready (most are done at the first look)."""
    end: float | None = None
    for event in events:
        while True:
            err = int(query(event))
            if err == 0:
                break
            if err != _NOT_READY:
                return err
            now = time.perf_counter()
            if end is None:
                end = now + seconds
            if now >= end:
                return err
    return 0
