"""HTML tables for Jupyter (``_repr_html_``) of memory usage, profiles, timelines and
the configuration: the presentation layer, in one place.

This module sits on top: it imports the value types, profiling, timelines and the
configuration, and nothing below imports it. Each display is built where its object
lives, from the standard-library helpers of :mod:`.html` (so ``MemoryUsage`` renders
itself without depending on presentation); this module gathers them under one name.
Every piece of text from the objects is escaped.
"""

from __future__ import annotations

from ..config.config import EffectiveConfig
from ..html import html_table, memory_report_html, memory_usage_html
from .records import profile_summary_html
from .timeline import timeline_html

__all__ = [
    "config_html",
    "html_table",
    "memory_report_html",
    "memory_usage_html",
    "profile_summary_html",
    "timeline_html",
]


def config_html(effective: EffectiveConfig) -> str:
    """The effective configuration: section, key, value and where it came from."""
    return effective._repr_html_()
