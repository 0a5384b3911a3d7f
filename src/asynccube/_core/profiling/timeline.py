"""Timelines of recorded kernels, copies and waits: Chrome trace / Perfetto JSON and plots.

The JSON is the Trace Event Format that ``chrome://tracing`` and https://ui.perfetto.dev
open: one complete (``"ph": "X"``) event per record, with ``pid`` the device and ``tid``
the stream, and metadata (``"ph": "M"``) events naming the process after the device and
each thread ``stream N``, so each stream is its own track. Timestamps are microseconds
from the earliest record.

Plotting needs matplotlib (``pip install 'asynccube[plot]'``); it is imported only when
a plot is drawn, and its absence raises an ImportError saying how to install it.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ..html import html_table
from .records import KernelRecord, format_ns

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["Timeline", "chrome_trace", "device_pid", "timeline_html", "write_chrome_trace"]

KIND_COLORS: Final = {"kernel": "#4C72B0", "copy": "#DD8452", "wait": "#8C8C8C"}
"""Colour of each record kind in plots."""


def device_pid(device: str) -> int:
    """The trace ``pid`` of a device: its index (``"cuda:1"`` -> 1), else 0."""
    _, _, index = device.partition(":")
    return int(index) if index.isdigit() else 0


def chrome_trace(
    records: Iterable[KernelRecord], *, device: str = "host", origin_ns: int | None = None
) -> dict[str, Any]:
    """The records as a Chrome trace / Perfetto JSON object (``{"traceEvents": [...]}``).

    Args:
        records: What to show.
        device: The device string; names the process and gives its pid.
        origin_ns: The timestamp shown as 0 (default: the earliest record's).
    """
    recs = list(records)
    pid = device_pid(device)
    origin = _origin(recs) if origin_ns is None else origin_ns
    events = _metadata_events(pid, device, sorted({r.stream for r in recs}))
    events += [_complete_event(r, pid, origin) for r in recs]
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": {"device": device}}


def _origin(records: list[KernelRecord]) -> int:
    return min((min(r.queued_ns, r.start_ns) for r in records), default=0)


def _metadata_events(pid: int, device: str, streams: list[int]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": device}}
    ]
    for index, stream in enumerate(streams):
        events.append(_thread_meta("thread_name", pid, stream, {"name": f"stream {stream}"}))
        events.append(_thread_meta("thread_sort_index", pid, stream, {"sort_index": index}))
    return events


def _thread_meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _complete_event(r: KernelRecord, pid: int, origin: int) -> dict[str, Any]:
    args: dict[str, Any] = {"queued_us": (r.queued_ns - origin) / 1e3}
    if r.nbytes is not None:
        args["bytes"] = r.nbytes
    return {
        "name": r.name,
        "cat": r.kind,
        "ph": "X",
        "ts": (r.start_ns - origin) / 1e3,
        "dur": r.duration_ns / 1e3,
        "pid": pid,
        "tid": r.stream,
        "args": args,
    }


def write_chrome_trace(
    records: Iterable[KernelRecord],
    path: str | os.PathLike[str],
    *,
    device: str = "host",
    origin_ns: int | None = None,
) -> Path:
    """Write :func:`chrome_trace` to ``path`` as JSON; returns the path."""
    out = Path(path)
    trace = chrome_trace(records, device=device, origin_ns=origin_ns)
    out.write_text(json.dumps(trace), encoding="utf-8")
    return out


def _require_matplotlib() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            "plotting a timeline needs matplotlib, which is not installed; "
            "install it with: pip install 'asynccube[plot]'  (or: pip install matplotlib)"
        ) from exc
    return Figure


class Timeline:
    """Recorded kernels, copies and waits of one device, by stream.

    Export with :meth:`to_chrome_trace` / :meth:`save` (open the file in Perfetto), or
    draw with :meth:`plot`. In Jupyter it displays as a plot when matplotlib is
    installed, else as a table per stream.

    Attributes:
        records: The records, ordered by start time.
        device: The device string they ran on.
        hint: Why there are no records and how to get them ("" when recording).
    """

    __slots__ = ("device", "hint", "records")

    def __init__(
        self, records: Iterable[KernelRecord], *, device: str = "host", hint: str = ""
    ) -> None:
        self.records = tuple(sorted(records, key=lambda r: (r.start_ns, r.stream)))
        self.device = device
        self.hint = hint

    def __repr__(self) -> str:
        hint = f"; {self.hint}" if self.hint else ""
        return (
            f"Timeline(device={self.device!r}, {len(self.records)} records, "
            f"{len(self.streams)} streams, span={format_ns(self.span_ns)}{hint})"
        )

    def __len__(self) -> int:
        return len(self.records)

    @property
    def streams(self) -> list[int]:
        """Stream ids with at least one record, ascending."""
        return sorted({r.stream for r in self.records})

    @property
    def span_ns(self) -> int:
        """From the earliest start to the latest end."""
        if not self.records:
            return 0
        return max(r.end_ns for r in self.records) - self.records[0].start_ns

    def busy_ns(self, stream: int) -> int:
        """Total time ``stream`` spent running records (overlaps counted once)."""
        busy, reach = 0, None
        for r in (r for r in self.records if r.stream == stream):
            start = r.start_ns if reach is None else max(r.start_ns, reach)
            busy += max(0, r.end_ns - start)
            reach = r.end_ns if reach is None else max(reach, r.end_ns)
        return busy

    def to_chrome_trace(self) -> dict[str, Any]:
        """The Chrome trace / Perfetto JSON object (see :func:`chrome_trace`)."""
        return chrome_trace(self.records, device=self.device)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the Chrome trace JSON to ``path``; returns the path."""
        return write_chrome_trace(self.records, path, device=self.device)

    def plot(self, ax: Axes | None = None) -> Axes:
        """Draw one row per stream, one bar per record, coloured by kind.

        Args:
            ax: Matplotlib axes to draw on; a new figure is made if omitted (without
                pyplot, so no global figure state is touched).

        Raises:
            ImportError: matplotlib is not installed.
        """
        figure_cls = _require_matplotlib()
        if ax is None:
            fig = figure_cls(figsize=(10, 1.2 + 0.45 * max(1, len(self.streams))))
            ax = fig.subplots()
        _draw(self, ax)
        return ax

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        try:
            return {"image/png": self._png(), "text/plain": repr(self)}
        except ImportError:
            return {"text/html": timeline_html(self), "text/plain": repr(self)}

    def _png(self) -> bytes:
        ax = self.plot()
        buf = io.BytesIO()
        ax.figure.savefig(buf, format="png", bbox_inches="tight")
        return buf.getvalue()


def _draw(timeline: Timeline, ax: Axes) -> None:
    from matplotlib.patches import Patch

    origin = timeline.records[0].start_ns if timeline.records else 0
    rows = {stream: i for i, stream in enumerate(timeline.streams)}
    for r in timeline.records:
        x = (r.start_ns - origin) / 1e3
        ax.broken_barh(
            [(x, r.duration_ns / 1e3)],
            (rows[r.stream] - 0.4, 0.8),
            facecolors=KIND_COLORS[r.kind],
            edgecolors="white",
            linewidth=0.5,
        )
    ax.set_yticks(list(rows.values()), [f"stream {s}" for s in rows])
    ax.invert_yaxis()
    ax.set_xlabel("time (µs)")
    ax.set_title(f"{timeline.device}: {len(timeline.records)} records")
    handles = [Patch(color=c, label=k) for k, c in KIND_COLORS.items()]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)


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
