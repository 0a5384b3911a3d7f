"""Which async library the caller runs under, checked when a client opens.

asyncio is the backend a client runs on (uvloop included: it is an asyncio loop). The
running library is detected with sniffio (as anyio and httpcore do), so a call from
trio, or from no event loop at all, fails at once with
:class:`~asynccube.UnsupportedBackend` saying what is needed, instead of a bare
``RuntimeError`` from deep inside.
"""

from __future__ import annotations

import asyncio
import sys
from types import ModuleType

from .errors import UnsupportedBackend

_sniffio: ModuleType | None
try:
    import sniffio as _sniffio
except ImportError:  # a declared dependency, but a bare environment (PYTHONPATH=src) may
    _sniffio = None  # lack it: detect asyncio and trio directly then

__all__ = ["SUPPORTED", "current_library", "running_loop"]

SUPPORTED = ("asyncio",)
"""The async libraries a client runs on."""


def running_loop(what: str) -> asyncio.AbstractEventLoop:
    """The running asyncio loop for ``what`` (e.g. ``"open_client()"``), or
    :class:`UnsupportedBackend` naming the library found and what to do."""
    library = current_library()
    if library is None:
        raise UnsupportedBackend(
            f"{what} needs a running asyncio event loop and none is running in this "
            "thread; call it from async code started by asyncio.run(main()) or "
            "anyio.run(main) (backend='asyncio')"
        )
    if library not in SUPPORTED:
        raise UnsupportedBackend(
            f"{what} was called under {library}, which asynccube does not run on yet; "
            f"run it under asyncio (uvloop included), e.g. anyio.run(main, "
            f"backend='asyncio'), or reach an asyncio thread from {library}"
        )
    return asyncio.get_running_loop()


def current_library() -> str | None:
    """The async library running in this thread (sniffio's name), or None."""
    if _sniffio is not None:
        try:
            return str(_sniffio.current_async_library())
        except _sniffio.AsyncLibraryNotFoundError:
            return None
    if asyncio._get_running_loop() is not None:
        return "asyncio"
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            return None
        return "trio"
    return None
