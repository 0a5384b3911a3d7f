"""The example FastAPI service under load on uvicorn, beside numpy on the loop and an echo
route, on asyncio and uvloop, with the loop lag its own ``LoopMonitor`` reports (issue 39).

Each server is ``examples/fastapi_service.py``'s app under uvicorn in its own process
(``_fastapi_app.py``): ``asynccube`` (the FastAPI app as users run it), ``starlette``
(the same service on plain Starlette), and two floors in the same FastAPI app with the
same checks of each body: ``numpy_loop`` (``2x + 1`` in numpy on the loop, no device)
and ``echo`` (the body sent back: the HTTP stack's own cost). Every request is
``bench_service.py``'s small workload: 256 KiB of float32 in, ``2x + 1``, 256 KiB out.

Load comes from other processes on 127.0.0.1 (``bench_service.apply_load``: ``--procs``
processes, ``--clients`` connections in all, a warm-up then ``--seconds`` measured; each
stops by itself, and every response is checked). Reported per server loop (asyncio;
uvloop where importable): requests/s, latency p50/p99, the service's ``LoopMonitor``
figures over the measured window (lag p50/p99/max, the worst step and its culprit) and
requests/s against the echo floor. With ``--runs N`` each service runs N times, round
after round; the run of median requests/s is reported, with the spread.

    python benchmarks/bench_fastapi.py --device host --quick   # host server, ~20 s
    python benchmarks/bench_fastapi.py --device cuda:0          # GPU machine, ~2.5 min

Needs fastapi, uvicorn and aiohttp (the load), uvloop where available. Writes
``results/fastapi.{json,md}`` (``fastapi_host`` on the host server).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, table, write
from _service_report import _rps_text
from bench_service import _first_line, _has_uvloop, _stop, _wrong, apply_load, child_env, rounds

HERE = Path(__file__).resolve().parent
PEERS = "asynccube,starlette,numpy_loop,echo"
QUICK = {"clients": 16, "procs": 2, "seconds": 2.0, "warmup": 0.5, "runs": 1}
FULL = {"clients": 64, "procs": 4, "seconds": 3.0, "warmup": 1.0, "runs": 3}
"""The load's defaults, with ``--quick`` and without (an option given wins)."""
START_S = 2.5
"""Seconds a run spends outside its warm-up and window (uvicorn and the app start, stop)."""


def _spawn_server(peer: str, loop: str, args: argparse.Namespace) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(HERE / "_fastapi_app.py"), "serve", peer, "--loop", loop,
           "--device", args.device, "--window", str(args.seconds), "--http", args.http]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=child_env())


def run_one(peer: str, loop: str, work: str, args: argparse.Namespace) -> dict[str, Any]:
    """One uvicorn server of ``peer`` under load: its figures, or ``{"skipped": why}``."""
    server = _spawn_server(peer, loop, args)
    try:
        first = _first_line(server, 120)
        if not first.startswith("PORT "):
            return {"skipped": first.removeprefix("SKIP ")}
        url = f"http://127.0.0.1:{first.split()[1]}"
        outs, stats, _ = apply_load(url, args, echo=peer == "echo", work=work)
    finally:
        _stop(server)
    lat = sorted(x for o in outs for x in o["latencies_us"])
    mon = stats["loop"]
    return {
        "requests_per_s": len(lat) / args.seconds,
        "p50_ms": lat[len(lat) // 2] / 1e3 if lat else None,
        "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] / 1e3 if lat else None,
        "loop_lag_p50_ms": mon["lag_p50_ms"],
        "loop_lag_p99_ms": mon["lag_p99_ms"],
        "loop_lag_max_ms": mon["lag_max_ms"],
        "worst_step_ms": mon["worst_step_ms"],
        "worst_step_culprit": mon["worst_step_culprit"],
        "monitor_samples": mon["samples"],
        "monitor_window_s": mon["window_s"],
        "served": stats["served"],
        "refused": stats["refused"],
        "checked": sum(o["checked"] for o in outs),
        "mismatches": sum(o["mismatches"] for o in outs),
        "errors": sum(o["errors"] for o in outs),
        "first_error": next((o["first_error"] for o in outs if o["first_error"]), ""),
        "server": stats["info"],
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _step(r: dict[str, Any]) -> str:
    if r.get("worst_step_ms") is None:
        return "none >= 1 ms"
    culprit = str(r["worst_step_culprit"]).replace("|", "/")
    return f"{r['worst_step_ms']:.2f} ({culprit[:70]})"


def render(by_loop: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    """The figures table and how they were measured."""
    rows = []
    for loop, peers in by_loop.items():
        echo = peers.get("echo", {}).get("requests_per_s")
        for peer, r in peers.items():
            if "skipped" in r:
                rows.append([loop, peer, "skipped", *["-"] * 5, r["skipped"][:90]])
                continue
            ratio = f"{r['requests_per_s'] / echo:.2f}x" if echo else "-"
            lag = "/".join(_ms(r[k]) for k in ("loop_lag_p50_ms", "loop_lag_p99_ms",
                                               "loop_lag_max_ms"))  # fmt: skip
            ok = f"{r['checked']} checked, {r['mismatches']} wrong, {r['errors']} errors"
            rows.append([loop, peer, _rps_text(r), ratio, _ms(r["p50_ms"]), _ms(r["p99_ms"]),
                         lag, _step(r), ok])  # fmt: skip
    head = ["loop", "service", "requests/s", "vs echo", "p50 ms", "p99 ms",
            "loop lag p50/p99/max ms (LoopMonitor)", "worst step ms (culprit)",
            "responses checked"]  # fmt: skip
    server = next((r["server"] for p in by_loop.values() for r in p.values() if "server" in r), "")
    stack = server.split(" on ", 1)[-1].rsplit(", ", 1)[0]  # uvicorn's version and protocol
    runs = (f", {args.runs} runs (requests/s: the median run's, the lowest and highest)"
            if args.runs > 1 else "")  # fmt: skip
    how = (
        "Each request: 256 KiB float32 in (`application/octet-stream`), `y = 2x + 1`, 256 "
        "KiB out, through `examples/fastapi_service.py` (its body limit, content-type and "
        "length checks, disconnect watch) under uvicorn: `asynccube` is its FastAPI app, "
        "`starlette` the same service on plain Starlette; `numpy_loop` and `echo` are the "
        "same FastAPI app computing in numpy on the loop or answering the body itself (the "
        f"HTTP stack's own cost). {args.clients} concurrent clients from {args.procs} load "
        f"processes on loopback, {args.warmup:g} s warm-up then {args.seconds:g} s measured "
        f"per service{runs}. The loop lag is the service's own `LoopMonitor` (the example's "
        "defaults: 10 ms ticker, steps timed one tick in ten; its window set to the measured "
        f"seconds), read at the window's end; worst step: the longest step it timed. Server: "
        f"{stack}. Command: `python benchmarks/"
        f"bench_fastapi.py --device {args.device} --loops {args.loops} --runs {args.runs} "
        f"--seconds {args.seconds:g} --warmup {args.warmup:g} --clients {args.clients} "
        f"--procs {args.procs}`."
    )
    return f"{table(head, rows)}\n\n{how}"


def expected_seconds(args: argparse.Namespace) -> float:
    """About how long the run takes."""
    runs = len(args.peers.split(",")) * len(args.loops.split(",")) * args.runs
    return runs * (args.warmup + args.seconds + START_S)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The options; ``--quick`` sets shorter defaults for those not given."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="host", help="host, cuda:0, ...")
    p.add_argument("--loops", default="asyncio,uvloop")
    p.add_argument("--peers", default=PEERS, help=f"services (default {PEERS})")
    p.add_argument("--http", default="auto", choices=("auto", "h11", "httptools"),
                   help="uvicorn's HTTP parser (auto: httptools where installed)")  # fmt: skip
    p.add_argument("--quick", action="store_true",
                   help="1 run, 2 s measured, 0.5 s warm-up, 16 clients, 2 processes")  # fmt: skip
    p.add_argument("--clients", type=int)
    p.add_argument("--procs", type=int)
    p.add_argument("--seconds", type=float)
    p.add_argument("--warmup", type=float)
    p.add_argument("--runs", type=int)
    p.add_argument("--json-only", action="store_true", help="print the figures, write nothing")
    args = p.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.runs < 1 or args.procs < 1 or args.clients < args.procs or args.seconds <= 0:
        p.error("--runs, --procs and --seconds must be > 0 and --clients >= --procs")
    unknown = set(args.peers.split(",")) - set(PEERS.split(","))
    if unknown:
        p.error(f"unknown services {sorted(unknown)}; choose among {PEERS}")
    return args


def main() -> int:
    args = parse()
    t0 = time.perf_counter()
    print(f"expected wall time: about {expected_seconds(args) / 60:.1f} min", flush=True)
    by_loop = rounds(run_one, args.peers.split(","), args.loops.split(","), "small", args)
    print(f"wall time: {(time.perf_counter() - t0) / 60:.1f} min", flush=True)
    wrong = _wrong({"small": {"http": by_loop}})
    if args.json_only:
        print(json.dumps(by_loop))
        return wrong
    device = args.device if args.device != "host" else ""
    uv = "" if _has_uvloop() else " (uvloop not installed: asyncio only)"
    title = f"FastAPI service under load (issue 39), device {args.device}{uv}"
    write("fastapi" + ("" if device else "_host"), title, environment(device),
          render(by_loop, args), {"results": by_loop, "args": vars(args)})  # fmt: skip
    return wrong


if __name__ == "__main__":
    sys.exit(main())
