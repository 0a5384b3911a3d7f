"""What asynccube's pytest plugin adds to the start of a pytest run that uses none of it.

pytest loads the plugin (entry point ``pytest11``) into every run of an environment
where asynccube is installed. This runs a one-test project that never imports asynccube,
``--runs`` times with the plugin and as many times without it (``-p
no:asynccube.pytest_plugin``), alternating, each in a fresh process, and reports the
medians of

* the CPU time (user + system) of the whole run (steadier than wall time on a shared
  machine);
* the import time pytest's ``python -X importtime`` charges to the plugin's modules
  (``_asynccube_pytest`` and what it imports first);
* the peak RSS of the process (``wait4``'s ``ru_maxrss``);
* and lists any heavy module (asynccube, numpy, cuda) the run imported.

Goal (issue 29): at most 20 ms and 2 MB added. Run::

    python benchmarks/bench_plugin_startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import environment, table, write

TEST = """
import sys

def test_plain():
    heavy = sorted({m.split(".")[0] for m in sys.modules} & {"asynccube", "numpy", "cuda"})
    print("HEAVY:", ",".join(heavy) or "-")
"""
OFF = ("-p", "no:asynccube.pytest_plugin")


def _plugin_args() -> tuple[str, ...]:
    """Nothing where the entry point is installed; else load its module by name."""
    eps = importlib.metadata.entry_points(group="pytest11")
    if any(ep.name == "asynccube.pytest_plugin" for ep in eps):
        return ()
    return ("-p", "_asynccube_pytest.plugin")


def _one(project: Path, extra: tuple[str, ...]) -> tuple[float, float, str]:
    """CPU seconds (user + system), plugin import seconds and heavy modules of a run."""
    cmd = [sys.executable, "-X", "importtime", "-m", "pytest", "-q", "-s", "-p"]
    cmd += ["no:cacheprovider", *extra, str(project)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, cwd=project, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"pytest failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    heavy = next(
        (line.split(":", 1)[1].strip() for line in done.stdout.splitlines() if "HEAVY:" in line),
        "?",
    )
    return cpu, _plugin_import_seconds(done.stderr), heavy


def _plugin_import_seconds(importtime: str) -> float:
    """Cumulative import time of the plugin's top-level modules (``-X importtime``)."""
    total = 0
    for line in importtime.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line.split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        name = parts[2].rstrip()
        depth = len(name) - len(name.lstrip())
        if depth == 1 and name.strip().startswith("_asynccube_pytest"):
            total += int(parts[1])
    return total / 1e6


def _rss_of(project: Path, extra: tuple[str, ...]) -> float:
    """Peak RSS (MiB) of one run, read by a wrapper process of its own."""
    code = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
        "stdout=subprocess.DEVNULL); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    cmd = [sys.executable, "-c", code, sys.executable, "-m", "pytest", "-q", "-p"]
    cmd += ["no:cacheprovider", *extra, str(project)]
    out = subprocess.run(cmd, cwd=project, check=True, capture_output=True, text=True)
    return int(out.stdout.split()[-1]) / 1024


def main() -> None:
    """Run both ways, alternating; print the medians and the difference."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    on = _plugin_args()
    results: dict[str, list[tuple[float, float, float, str]]] = {"with": [], "without": []}
    with tempfile.TemporaryDirectory(prefix="asynccube-bench-plugin-") as tmp:
        project = Path(tmp)
        (project / "pytest.ini").write_text("[pytest]\n")
        (project / "test_plain.py").write_text(TEST)
        _one(project, on)  # warm the file cache (and write no bytecode of the project)
        for _ in range(args.runs):
            for key, extra in (("with", on), ("without", (*on, *OFF))):
                cpu, imp, heavy = _one(project, extra)
                rss = _rss_of(project, extra)
                results[key].append((cpu, imp, rss, heavy))
    med = {
        key: [statistics.median(r[i] for r in runs) for i in range(3)]
        for key, runs in results.items()
    }
    pairs = zip(results["with"], results["without"], strict=True)
    d_cpu = statistics.median(w[0] - wo[0] for w, wo in pairs) * 1e3
    d_rss = med["with"][2] - med["without"][2]
    heavy = {key: ",".join(sorted({r[3] for r in runs})) for key, runs in results.items()}
    imports = med["with"][1] * 1e3
    rows = [
        ["CPU time of the run (ms)", *(f"{med[k][0] * 1e3:.0f}" for k in results), f"{d_cpu:+.1f}"],
        ["import time of the plugin (ms, -X importtime)", f"{imports:.1f}", "0", f"{imports:+.1f}"],
        ["peak RSS (MiB)", *(f"{med[k][2]:.1f}" for k in results), f"{d_rss:+.2f}"],
        ["heavy modules imported (asynccube, numpy, cuda)", heavy["with"], heavy["without"], ""],
    ]
    body = table(["figure", "with the plugin", "-p no:asynccube.pytest_plugin", "added"], rows)
    body += (
        f"\n\nGoal: at most 20 ms and 2 MB added. Medians of {args.runs} runs each way, "
        "alternating, of a one-test project that never imports asynccube (CPU time of the "
        "whole process: on a shared machine its run-to-run noise is tens of ms, the import "
        "time is the plugin's own share). Command: `python benchmarks/bench_plugin_startup.py`."
    )
    write(
        "plugin_startup",
        "pytest plugin: start-up cost for a project that does not use it (issue 29)",
        environment(),
        body,
        {"with": med["with"], "without": med["without"], "added_cpu_ms": d_cpu},
    )


if __name__ == "__main__":
    main()
