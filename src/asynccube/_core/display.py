"""HTML tables for Jupyter (``_repr_html_``) of memory usage, profiles and timelines.

Each function takes the object and returns an HTML fragment; classes attach them as
``def _repr_html_(self): return memory_usage_html(self)``. Every piece of text from the
objects is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from .config import format_value
from .profiling import format_ns
from .types import MemoryUsage, _fmt_bytes

if TYPE_CHECKING:
    from .config import EffectiveConfig
    from .profiling import ProfileSummary
    from .timeline import Timeline

__all__ = [
    "config_html",
    "html_table",
    "memory_report_html",
    "memory_usage_html",
    "profile_summary_html",
    "timeline_html",
]

_MEMORY_HEADER = ("allocations", "in use", "padding", "reserved")


def html_table(
    header: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    caption: str | None = None,
    numeric_from: int = 1,
) -> str:
    """An escaped HTML table; columns from ``numeric_from`` on are right-aligned."""
    head = "".join(_cell("th", h, i >= numeric_from) for i, h in enumerate(header))
    body = "".join(
        "<tr>" + "".join(_cell("td", c, i >= numeric_from) for i, c in enumerate(row)) + "</tr>"
        for row in rows
    )
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(tag: str, value: object, right: bool) -> str:
    style = ' style="text-align:right"' if right else ' style="text-align:left"'
    return f"<{tag}{style}>{html.escape(str(value))}</{tag}>"


def _usage_cells(usage: MemoryUsage) -> tuple[str, ...]:
    return (
        str(usage.number_allocs),
        _fmt_bytes(usage.bytes_in_use),
        _fmt_bytes(usage.bytes_padding),
        _fmt_bytes(usage.bytes_reserved),
    )


def memory_usage_html(usage: MemoryUsage) -> str:
    """One row: allocations, bytes in use, padding and reserved."""
    return html_table(_MEMORY_HEADER, [_usage_cells(usage)], caption="Memory usage", numeric_from=0)


def memory_report_html(
    report: Mapping[str, MemoryUsage] | Iterable[tuple[str, MemoryUsage]],
    *,
    title: str = "Memory report",
) -> str:
    """One row per part (pool, stream, ...) and a total row.

    Args:
        report: Usage by part name, as a mapping or ``(name, usage)`` pairs.
        title: The table's caption.
    """
    items = list(report.items() if isinstance(report, Mapping) else report)
    total = MemoryUsage()
    for _, usage in items:
        total = total.combine(usage)
    rows = [(name, *_usage_cells(u)) for name, u in items]
    rows.append(("total", *_usage_cells(total)))
    return html_table(("part", *_MEMORY_HEADER), rows, caption=title)


def profile_summary_html(summary: ProfileSummary, *, title: str = "Profile summary") -> str:
    """One row per name: count, total, mean, min and max, largest total first."""
    rows = [
        (
            s.name,
            s.count,
            format_ns(s.total_ns),
            format_ns(s.mean_ns),
            format_ns(s.min_ns),
            format_ns(s.max_ns),
        )
        for s in summary
    ]
    header = ("name", "count", "total", "mean", "min", "max")
    return html_table(header, rows, caption=title)


def timeline_html(timeline: Timeline) -> str:
    """Per stream: records by kind, busy time and span (the plot's text fallback)."""
    rows = []
    for stream in timeline.streams:
        recs = [r for r in timeline.records if r.stream == stream]
        kinds = {k: sum(r.kind == k for r in recs) for k in ("kernel", "copy", "wait")}
        busy = timeline.busy_ns(stream)
        span = max(r.end_ns for r in recs) - min(r.start_ns for r in recs)
        rows.append((f"stream {stream}", *kinds.values(), format_ns(busy), format_ns(span)))
    caption = (
        f"Timeline of {timeline.device}: {len(timeline.records)} records over "
        f"{format_ns(timeline.span_ns)} (install matplotlib for a plot)"
    )
    header = ("stream", "kernels", "copies", "waits", "busy", "span")
    return html_table(header, rows, caption=caption)


def config_html(effective: EffectiveConfig) -> str:
    """The effective configuration: section, key, value and where it came from."""
    rows = [(f"{s}.{k}", format_value(v), src) for s, k, v, src in effective.items()]
    caption = f"asynccube configuration ({effective.file or 'no config file'})"
    return html_table(("key", "value", "source"), rows, caption=caption, numeric_from=99)
