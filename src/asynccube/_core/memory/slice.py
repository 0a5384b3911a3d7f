"""Slice tokens, re-exported for the memory package (they live in ``_core.slices`` so
that value types can use them without importing the memory manager)."""

from __future__ import annotations

from ..values.slices import ReleaseQueue, SliceHandle

__all__ = ["ReleaseQueue", "SliceHandle"]
