"""HTML building blocks for Jupyter displays (``_repr_html_``): escaped tables, byte
sizes, and the memory-usage tables.

The bottom of the presentation stack: standard library only, so that value types can
render themselves without depending on :mod:`.display` (which sits on top and gathers
every display of the package). Every piece of text is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

__all__ = [
    "UsageLike",
    "fmt_bytes",
    "html_table",
    "memory_report_html",
    "memory_usage_html",
    "usage_cells",
]

_MEMORY_HEADER = ("allocations", "in use", "padding", "reserved")


class UsageLike(Protocol):
    """What a memory-usage table shows (``MemoryUsage`` has these)."""

    @property
    def number_allocs(self) -> int: ...
    @property
    def bytes_in_use(self) -> int: ...
    @property
    def bytes_padding(self) -> int: ...
    @property
    def bytes_reserved(self) -> int: ...


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


def fmt_bytes(n: int) -> str:
    """``n`` bytes for people: ``"512 B"``, ``"1.5 KiB"``, ... up to GiB."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def usage_cells(usage: UsageLike) -> tuple[str, ...]:
    """Allocations, bytes in use, padding and reserved, formatted."""
    return (
        str(usage.number_allocs),
        fmt_bytes(usage.bytes_in_use),
        fmt_bytes(usage.bytes_padding),
        fmt_bytes(usage.bytes_reserved),
    )


def memory_usage_html(usage: UsageLike) -> str:
    """One row: allocations, bytes in use, padding and reserved."""
    return html_table(_MEMORY_HEADER, [usage_cells(usage)], caption="Memory usage", numeric_from=0)


def memory_report_html(
    report: Mapping[str, UsageLike] | Iterable[tuple[str, UsageLike]],
    *,
    title: str = "Memory report",
) -> str:
    """One row per part (pool, stream, ...) and a total row.

    Args:
        report: Usage by part name, as a mapping or ``(name, usage)`` pairs.
        title: The table's caption.
    """
    items = list(report.items() if isinstance(report, Mapping) else report)
    rows: list[tuple[str, ...]] = [(name, *usage_cells(u)) for name, u in items]
    totals = [
        sum(getattr(u, field) for _, u in items)
        for field in ("number_allocs", "bytes_in_use", "bytes_padding", "bytes_reserved")
    ]
    rows.append(("total", str(totals[0]), *(fmt_bytes(t) for t in totals[1:])))
    return html_table(("part", *_MEMORY_HEADER), rows, caption=title)
