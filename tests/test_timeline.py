"""Timeline export (Chrome trace / Perfetto JSON), plots, and the HTML displays."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from asynccube._core.profiling.display import (
    html_table,
    memory_report_html,
    memory_usage_html,
    timeline_html,
)
from asynccube._core.profiling.records import KernelRecord
from asynccube._core.profiling.timeline import (
    Timeline,
    chrome_trace,
    device_pid,
    write_chrome_trace,
)
from asynccube._core.values.types import MemoryUsage

RECORDS = [
    KernelRecord("write", 1, "copy", 1_000, 1_000, 3_000, nbytes=4096),
    KernelRecord("add_f32", 1, "kernel", 1_500, 3_000, 10_000),
    KernelRecord("wait 1", 2, "wait", 9_000, 10_000, 10_000),
    KernelRecord("mul_f32", 2, "kernel", 2_000, 10_000, 14_000),
    KernelRecord("add_f32", 5, "kernel", 2_500, 4_000, 6_000),
    KernelRecord("read", 1, "copy", 10_500, 14_000, 15_000, nbytes=4096),
]


def events(trace: dict[str, Any], ph: str, name: str | None = None) -> list[dict[str, Any]]:
    out = [e for e in trace["traceEvents"] if e["ph"] == ph]
    return [e for e in out if name is None or e["name"] == name]


def test_trace_file_loads_with_one_track_per_stream_and_one_event_per_record(
    tmp_path: Path,
) -> None:
    path = write_chrome_trace(RECORDS, tmp_path / "trace.json", device="cuda:1")
    trace = json.loads(path.read_text(encoding="utf-8"))
    complete = events(trace, "X")
    assert len(complete) == len(RECORDS)
    tracks = events(trace, "M", "thread_name")
    assert sorted(e["tid"] for e in tracks) == [1, 2, 5]
    assert {e["args"]["name"] for e in tracks} == {"stream 1", "stream 2", "stream 5"}
    assert {e["pid"] for e in trace["traceEvents"]} == {1}
    (process,) = events(trace, "M", "process_name")
    assert process["args"]["name"] == "cuda:1"
    assert {e["tid"] for e in complete} == {1, 2, 5}


def test_complete_events_carry_times_in_microseconds() -> None:
    trace = chrome_trace(RECORDS)
    by_name = {(e["name"], e["tid"]): e for e in events(trace, "X")}
    add = by_name["add_f32", 1]
    assert (add["ts"], add["dur"], add["cat"]) == (2.0, 7.0, "kernel")  # origin = 1000 ns
    assert add["args"]["queued_us"] == 0.5
    assert by_name["write", 1]["args"]["bytes"] == 4096
    assert "bytes" not in add["args"]
    assert by_name["wait 1", 2]["cat"] == "wait"
    for e in events(trace, "X"):
        assert e["ts"] >= 0
        assert e["dur"] >= 0


def test_origin_can_be_given() -> None:
    trace = chrome_trace(RECORDS[:1], origin_ns=0)
    assert events(trace, "X")[0]["ts"] == 1.0


def test_empty_trace_is_valid() -> None:
    trace = json.loads(json.dumps(chrome_trace([])))
    assert events(trace, "X") == []
    assert len(events(trace, "M", "process_name")) == 1


@pytest.mark.parametrize(("device", "pid"), [("host", 0), ("cuda:0", 0), ("cuda:3", 3)])
def test_device_pid(device: str, pid: int) -> None:
    assert device_pid(device) == pid


def test_timeline_streams_span_and_busy_time(tmp_path: Path) -> None:
    tl = Timeline(reversed(RECORDS), device="host")
    assert [r.start_ns for r in tl.records] == sorted(r.start_ns for r in RECORDS)
    assert tl.streams == [1, 2, 5]
    assert tl.span_ns == 14_000
    assert tl.busy_ns(1) == 2_000 + 7_000 + 1_000
    assert tl.busy_ns(2) == 4_000
    assert len(tl) == len(RECORDS)
    assert "3 streams" in repr(tl)
    saved = json.loads(tl.save(tmp_path / "t.json").read_text(encoding="utf-8"))
    assert saved == json.loads(json.dumps(tl.to_chrome_trace()))


def test_busy_time_counts_overlaps_once() -> None:
    tl = Timeline(
        [
            KernelRecord("a", 0, "kernel", 0, 0, 10),
            KernelRecord("b", 0, "kernel", 0, 5, 12),
            KernelRecord("c", 0, "kernel", 0, 20, 25),
        ]
    )
    assert tl.busy_ns(0) == 17


def hide_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.patches"):
        monkeypatch.setitem(sys.modules, name, None)


def test_plot_without_matplotlib_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_matplotlib(monkeypatch)
    with pytest.raises(ImportError, match=r"pip install 'asynccube\[plot\]'"):
        Timeline(RECORDS).plot()


def test_notebook_display_falls_back_to_html(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_matplotlib(monkeypatch)
    bundle = Timeline(RECORDS, device="cuda:0")._repr_mimebundle_()
    assert set(bundle) == {"text/html", "text/plain"}
    assert "stream 5" in bundle["text/html"]
    assert "install matplotlib" in bundle["text/html"]


def test_plot_draws_one_row_per_stream() -> None:
    pytest.importorskip("matplotlib")
    ax = Timeline(RECORDS, device="cuda:0").plot()
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["stream 1", "stream 2", "stream 5"]
    assert len(ax.collections) == len(RECORDS)
    png = Timeline(RECORDS)._repr_mimebundle_()["image/png"]
    assert png.startswith(b"\x89PNG")


def test_timeline_html_counts_by_kind() -> None:
    page = timeline_html(Timeline(RECORDS))
    assert page.count("<tr>") == 1 + 3
    assert '<td style="text-align:left">stream 1</td>' in page


# -- display tables ---------------------------------------------------------------------------


def test_memory_usage_html() -> None:
    page = memory_usage_html(MemoryUsage(3, 2048, 64, 1 << 20))
    assert "<caption>Memory usage</caption>" in page
    assert "2.0 KiB" in page
    assert "1.0 MiB" in page
    assert page.count("<tr>") == 2


def test_memory_report_html_adds_a_total_row() -> None:
    report = {"sliced": MemoryUsage(2, 1024, 0, 4096), "exclusive": MemoryUsage(1, 1024, 0, 2048)}
    page = memory_report_html(report)
    assert page.count("<tr>") == 1 + 2 + 1
    assert ">total<" in page
    assert "6.0 KiB" in page
    assert page == memory_report_html(list(report.items()))


def test_html_table_escapes_everything() -> None:
    page = html_table(["<h>"], [["<script>"]], caption="a & b")
    assert "<script>" not in page
    assert "&lt;script&gt;" in page
    assert "a &amp; b" in page
