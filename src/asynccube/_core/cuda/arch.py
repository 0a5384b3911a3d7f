"""The NVRTC architecture of a compute capability (used by the driver's property query
and by the compiler; kept apart so that neither imports the other)."""

from __future__ import annotations

from typing import Final

__all__ = ["arch_for"]

_ARCH_SPECIFIC: Final = frozenset({(9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1)})


def arch_for(cc: tuple[int, int]) -> str:
    """The NVRTC ``-arch`` for compute capability ``cc``: ``sm_XY``, or ``sm_XYa``
    where the architecture has arch-specific features (9.0, 10.0, ...)."""
    major, minor = cc
    return f"sm_{major}{minor}{'a' if (major, minor) in _ARCH_SPECIFIC else ''}"
