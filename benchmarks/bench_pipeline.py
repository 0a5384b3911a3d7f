"""The example pipeline (``examples/ray_pipeline.py``) on one device: with and without
asynccube, under Ray and on one host without Ray, each beside its copy floor.

* one host, no Ray: the two stages as two clients on ``--device`` (each item created
  on the first, handed to the second with ``to_client``, read back once: ``handles``;
  or read and created again between the stages: ``numpy``), beside the same stages
  without asynccube (torch in a thread on a GPU, numpy on the host);
* Ray: the stages as Ray async actors (``num_gpus=0.5`` each on a GPU), numpy through
  the object store, beside the same actors with torch (numpy on the host);
* the copy floor, in the same run: the bytes every item moves (in, then out), copied
  by torch from and to pinned host buffers on two streams, both directions
  overlapping (on the host: two ``np.copyto`` per item).

Each figure is items per second, the median of ``--runs`` runs with their spread; every
result is checked (``z == x - 0.5``).

    python benchmarks/bench_pipeline.py --device cuda:0 --runs 3      # on the GPU
    python benchmarks/bench_pipeline.py --device host --items 64      # anywhere

Writes ``results/pipeline.json|md`` (``pipeline_host`` for the host server). Ray and
torch are optional: a part that cannot run says why.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples"))
import ray_pipeline as rp  # noqa: E402
from _common import environment, table, write  # noqa: E402

Figures = dict[str, Any]


def _runs(fn: Callable[[], float], runs: int) -> Figures:
    rates = [fn() for _ in range(runs)]
    return {"per_s": statistics.median(rates), "runs": rates}


def one_host(device: str, items: list[np.ndarray], runs: int) -> Figures:
    """The plain-asyncio driver: handles between the stages, numpy, and without us."""
    devices = [device, device]

    def run(handles: bool, plain: bool) -> float:
        out, rate = asyncio.run(rp.local_pipeline(devices, items, handles=handles, plain=plain))
        rp.check(items, out)
        return rate

    return {
        "handles": _runs(lambda: run(True, False), runs),
        "numpy": _runs(lambda: run(False, False), runs),
        "plain": _runs(lambda: run(False, True), runs),
    }


def copy_floor(device: str, items: list[np.ndarray], runs: int) -> Figures:
    """Items/s of the bytes alone: each item in, then out (see the module docstring)."""
    if device == "host":
        return _runs(lambda: _numpy_copies(items), runs)
    try:
        import torch
    except ImportError as exc:
        return {"skipped": f"torch is not installed ({exc})"}
    return _runs(lambda: _torch_copies(torch, device, items), runs)


def _numpy_copies(items: list[np.ndarray]) -> float:
    staged, back = np.empty_like(items[0]), np.empty_like(items[0])
    t0 = time.perf_counter()
    for x in items:
        np.copyto(staged, x)
        np.copyto(back, staged)
    return len(items) / (time.perf_counter() - t0)


def _torch_copies(torch: Any, device: str, items: list[np.ndarray]) -> float:
    ring = 8
    src = [torch.from_numpy(items[i % len(items)]).pin_memory() for i in range(ring)]
    dst = [torch.empty_like(s).pin_memory() for s in src]
    dev = [torch.empty(s.shape, dtype=s.dtype, device=device) for s in src]
    h2d, d2h = torch.cuda.Stream(device), torch.cuda.Stream(device)
    done = [torch.cuda.Event() for _ in range(ring)]
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for i in range(len(items)):
        k = i % ring
        with torch.cuda.stream(h2d):
            h2d.wait_event(done[k]) if i >= ring else None
            dev[k].copy_(src[k], non_blocking=True)
            arrived = torch.cuda.Event()
            arrived.record(h2d)
        with torch.cuda.stream(d2h):
            d2h.wait_event(arrived)
            dst[k].copy_(dev[k], non_blocking=True)
            done[k].record(d2h)
    torch.cuda.synchronize(device)
    rate = len(items) / (time.perf_counter() - t0)
    assert torch.equal(dst[0], src[0])
    return float(rate)


def under_ray(device: str, items: list[np.ndarray], runs: int) -> Figures:
    """Ray async actors, asynccube's and the same without it (see the module docstring)."""
    try:
        import ray
    except ImportError as exc:
        return {"skipped": f"ray is not installed ({exc})"}
    inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    path = os.pathsep.join([str(HERE.parent / "examples"), str(HERE.parent / "src"), *inherited])
    env = {"env_vars": {"PYTHONPATH": path, "NCCL_NVLS_ENABLE": "0"}}
    gpus = 1 if device.startswith("cuda") else 0
    ray.init(num_cpus=4, num_gpus=gpus, include_dashboard=False, log_to_driver=False,
             runtime_env=env)  # fmt: skip
    try:

        def run(plain: bool) -> float:
            out, rate = asyncio.run(rp.ray_pipeline([device, device], items, plain=plain))
            rp.check(items, out)
            return rate

        ours = _runs(lambda: run(False), runs)
        plain = _runs(lambda: run(True), runs)
    finally:
        ray.shutdown()
    return {"asynccube": ours, "plain": plain, "ray": ray.__version__}


def _rate(f: Figures) -> str:
    if "skipped" in f:
        return f"skipped: {f['skipped']}"
    spread = f" ({min(f['runs']):.0f}-{max(f['runs']):.0f})" if len(f["runs"]) > 1 else ""
    return f"{f['per_s']:.0f}{spread}"


def _ratio(a: Figures, b: Figures) -> str:
    if "per_s" not in a or "per_s" not in b:
        return "-"
    return f"{a['per_s'] / b['per_s']:.2f}x"


def render(figs: Figures, args: argparse.Namespace) -> str:
    host, floor, ray = figs["one_host"], figs["copy_floor"], figs["ray"]
    peer = "torch" if args.device.startswith("cuda") else "numpy"
    rows = [
        ["one host, handles (`to_client`)", _rate(host["handles"]),
         _ratio(host["handles"], host["plain"]), _ratio(host["handles"], floor), "0.8x floor"],
        ["one host, numpy between stages", _rate(host["numpy"]),
         _ratio(host["numpy"], host["plain"]), _ratio(host["numpy"], floor), "-"],
        [f"one host, without asynccube ({peer})", _rate(host["plain"]), "1.00x",
         _ratio(host["plain"], floor), "-"],
    ]  # fmt: skip
    if "skipped" in ray:
        rows.append(["Ray actors", f"skipped: {ray['skipped']}", "-", "-", "-"])
    else:
        rows += [
            [f"Ray {ray['ray']} actors, asynccube", _rate(ray["asynccube"]),
             _ratio(ray["asynccube"], ray["plain"]), _ratio(ray["asynccube"], floor),
             "1.0x the Ray peer"],
            [f"Ray {ray['ray']} actors, without asynccube ({peer})", _rate(ray["plain"]),
             "1.00x", _ratio(ray["plain"], floor), "-"],
        ]  # fmt: skip
    rows.append(["copy floor (in, then out, pinned)", _rate(floor), "-", "1.00x", "-"])
    body = table(["pipeline", "items/s (spread)", "vs without asynccube", "vs copy floor",
                  "goal"], rows)  # fmt: skip
    how = (
        f"Two stages (`y = 2x + 1`, then `z = y / 2 - 1`), {args.items} items of "
        f"{4 * args.size // 1024} KiB float32 on {args.device}, {args.runs} runs (median, "
        "lowest-highest). The copy floor moves each item's bytes in and out of the device "
        "from pinned host buffers on two streams (torch), the least any pipeline that takes "
        "numpy in and gives numpy out can cost. Command: `python benchmarks/bench_pipeline.py "
        f"--device {args.device} --items {args.items} --size {args.size} --runs {args.runs}`."
    )
    return f"{body}\n\n{how}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="host")
    p.add_argument("--items", type=int, default=256)
    p.add_argument("--size", type=int, default=1 << 20, help="float32 elements per item")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-ray", action="store_true", help="skip the Ray part")
    p.add_argument("--json-only", action="store_true", help="print, write nothing")
    args = p.parse_args()
    if args.items < 4 or args.size < 1 or args.runs < 1:
        p.error("--items must be >= 4, --size and --runs >= 1")
    items = rp.make_items(args.items, args.size)
    figs: Figures = {"copy_floor": copy_floor(args.device, items, args.runs)}
    print("copy floor", figs["copy_floor"], flush=True)
    figs["one_host"] = one_host(args.device, items, args.runs)
    print("one host", figs["one_host"], flush=True)
    figs["ray"] = (
        {"skipped": "--no-ray"} if args.no_ray else under_ray(args.device, items, args.runs)
    )
    print(render(figs, args))
    if not args.json_only:
        name = "pipeline" if args.device != "host" else "pipeline_host"
        title = f"The example pipeline on {args.device} (issue 30)"
        device = args.device if args.device != "host" else ""
        write(name, title, environment(device), render(figs, args), figs | {"args": vars(args)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
