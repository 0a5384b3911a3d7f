"""Join the benchmarks' results into ``benchmarks/RESULTS.md``.

Run after the benchmarks: ``python benchmarks/report.py``. Sections come from
``results/<name>.md`` files (written by benchmarks through ``_common.write``), each
followed by ``notes/<name>.md`` where present (what limits a missed figure); the memory
and stream benchmarks' JSON files are rendered here.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from _common import RESULTS, table

ORDER = ("requests", "concurrency", "cuda_tight", "sync_cuda", "collectives", "memory_churn",
         "pipeline_2gpu", "requests_host", "channel", "memory", "streams", "cuda", "service",
         "service_compute", "service_phases", "service_admit4", "fastapi", "service_host",
         "service_compute_host", "service_phases_host", "fastapi_host")  # fmt: skip
NOTES = Path(__file__).parent / "notes"  # notes/<name>.md follows section <name>


def _stamp(path: Path, data: dict[str, Any]) -> str:
    when = data.get("date") or dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC).strftime(
        "%Y-%m-%d %H:%M UTC"
    )  # the run's own date; a file's mtime only for results written before it was kept
    cpu = f"{data.get('machine', '?')}, {data.get('cpu_count', 2)} cores"
    return f"date {when}, python {data.get('python', '?')}, cpu {cpu}, device host (numpy)"


def _memory(path: Path) -> str:
    d = json.loads(path.read_text())
    hot = d["hot_path_us"]
    amp = d["amplification"]["default"]
    tasks = d["tasks"]["default"]
    rows = [
        [
            "pool-hit reserve + free, 1 KiB (µs)",
            f"{hot['reserve+free 1 KiB (sliced)']:.2f}",
            "<= 2.0",
            f"numpy.empty 1 KiB: {hot['numpy.empty 1 KiB']:.2f} µs",
        ],
        [
            "reservation amplification, mixed trace 1 KiB..512 MiB",
            f"{amp['ratio']:.3f}",
            "<= 1.25",
            f"cubecl's exclusive-pages preset: "
            f"{d['amplification']['exclusive_pages']['ratio']:.2f}",
        ],
        [
            "200 short-lived tasks vs one task, reserved ratio",
            f"{tasks['ratio']:.2f}",
            "<= 1.5",
            f"one manager per stream: {tasks['manager_per_stream_ratio']:.0f}x",
        ],
    ]
    body = table(["figure", "asynccube", "goal", "peer / comparison"], rows)
    return (
        f"## Memory management (issue 3)\n\n{_stamp(path, d)}\n\n{body}\n\n"
        "Command: `python benchmarks/bench_memory.py`.\n"
    )


def _streams(path: Path) -> str:
    d = json.loads(path.read_text())
    rows = []
    for work, by_tasks in d["throughput"].items():
        for n, r in by_tasks.items():
            rows.append(
                [
                    work,
                    n,
                    f"{r['asynccube_per_s']:.0f}",
                    f"{r['speedup_vs_1_task']:.2f}x",
                    f"{r['numpy_threads_per_s']:.0f}",
                    f"{r['vs_numpy_threads']:.2f}x",
                ]
            )
    body = table(
        [
            "kernel",
            "tasks",
            "asynccube kernels/s",
            "speed-up vs 1 task",
            "numpy thread pool kernels/s",
            "ratio",
        ],
        rows,
    )
    resolve = "; ".join(f"{k}: {v:.2f} µs" for k, v in d["resolve_us"].items())
    return (
        f"## Host streams (issue 4)\n\n{_stamp(path, d)}, BLAS threads {d['blas_threads']}\n\n"
        f"{body}\n\n`MultiStream.resolve` overhead: {resolve}.\n\n"
        "Command: `python benchmarks/bench_streams.py`.\n"
    )


RENDERERS = {"memory": _memory, "streams": _streams}


def _section(name: str) -> str | None:
    md, notes = RESULTS / f"{name}.md", NOTES / f"{name}.md"
    if md.exists():
        text = md.read_text()
        return text + "\n" + notes.read_text() if notes.exists() else text
    js = RESULTS / f"{name}.json"
    if name in RENDERERS and js.exists():
        return RENDERERS[name](js)
    return None


def main() -> None:
    names = list(ORDER) + sorted(p.stem for p in RESULTS.glob("*.md") if p.stem not in ORDER)
    sections = [s for s in (_section(n) for n in names) if s]
    head = (
        "# Benchmark results\n\nEvery figure is measured against its peer in the same run. "
        "Regenerate with the command under each table, then `python benchmarks/report.py`.\n"
    )
    out = Path(__file__).parent / "RESULTS.md"
    out.write_text("\n".join([head, *sections]))
    print(f"wrote {out} ({len(sections)} sections)")


if __name__ == "__main__":
    main()
