"""Whether asynccube may use its compiled extensions (``_native_slices``, ``cuda._native``,
``client._native_dlpack``, ``channel._native_future``).

``ASYNCCUBE_NO_EXTENSIONS`` set to any value but ``""`` and ``"0"`` forces the pure-Python
twins, as in aiohttp and yarl; ``setup.py`` then builds no extension either.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["compiled", "no_extensions"]


def no_extensions() -> bool:
    """True where ``ASYNCCUBE_NO_EXTENSIONS`` forces the pure-Python twins."""
    return os.environ.get("ASYNCCUBE_NO_EXTENSIONS", "") not in ("", "0")


def compiled(name: str, forced_off: bool | None = None) -> tuple[ModuleType | None, str]:
    """The compiled module ``name`` (absolute) and why it is used, or None and why not:
    ``forced_off`` (default: :func:`no_extensions`), or the import failed."""
    if no_extensions() if forced_off is None else forced_off:
        return None, "ASYNCCUBE_NO_EXTENSIONS is set"
    try:
        return importlib.import_module(name), "the compiled extension is loaded"
    except ImportError as exc:
        return None, f"the compiled extension is not available ({exc})"
