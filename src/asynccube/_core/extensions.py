"""Whether asynccube may use its compiled extensions (``_native_slices``, ``cuda._native``).

``ASYNCCUBE_NO_EXTENSIONS`` set to any value but ``""`` and ``"0"`` forces the pure-Python
twins, as in aiohttp and yarl; ``setup.py`` then builds no extension either.
"""

from __future__ import annotations

import os

__all__ = ["no_extensions"]


def no_extensions() -> bool:
    """True where ``ASYNCCUBE_NO_EXTENSIONS`` forces the pure-Python twins."""
    return os.environ.get("ASYNCCUBE_NO_EXTENSIONS", "") not in ("", "0")
