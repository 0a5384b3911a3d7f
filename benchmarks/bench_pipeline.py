"""The example pipeline (``examples/ray_pipeline.py``) on one device or two: with and
without asynccube, under Ray and on one host without Ray, each beside its copy floor.

* one host, no Ray: the two stages as two clients, both on ``--device`` or one on each
  of ``--devices A,B`` (each item created on the first, handed to the second with
  ``to_client``, read back once: ``handles``; or read and created again between the
  stages: ``numpy``), beside the same stages without asynccube (torch in a thread on a
  GPU, numpy on the host);
* Ray: the stages as Ray async actors (``num_gpus=0.5`` each on one GPU, ``num_gpus=1``
  each on two), numpy through the object store, beside the same actors with torch
  (numpy on the host);
* the copy floor, in the same run: the bytes every item moves (in, then out), copied
  by torch from and to pinned host buffers on two streams, both directions
  overlapping (on the host: two ``np.copyto`` per item); on two GPUs, in on the first,
  a peer copy to the second and out from there, on three streams.

Each figure is items per second, the median of ``--runs`` runs with their spread; every
result is checked (``z == x - 0.5``).

    python benchmarks/bench_pipeline.py --device cuda:0 --runs 3      # on the GPU
    python benchmarks/bench_pipeline.py --devices cuda:0,cuda:1 --runs 3  # on two GPUs
    python benchmarks/bench_pipeline.py --device host --items 64      # anywhere

Writes ``results/pipeline.json|md`` (``pipeline_host`` for the host server,
``pipeline_2gpu`` for two GPUs). Ray and torch are optional: a part that cannot run says
why. ``--json-only`` writes nothing and prints the figures as JSON on the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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


def one_host(devices: list[str], items: list[np.ndarray], runs: int) -> Figures:
    """The plain-asyncio driver: handles between the stages, numpy, and without us."""

    def run(handles: bool, plain: bool, staged: bool = False) -> float:
        pipe = rp.local_pipeline(devices, items, handles=handles, plain=plain, staged=staged)
        out, rate = asyncio.run(pipe)
        rp.check(items, out)
        return rate

    return {
        "handles": _runs(lambda: run(True, False), runs),
        "staged": _runs(lambda: run(True, False, True), runs),
        "numpy": _runs(lambda: run(False, False), runs),
        "plain": _runs(lambda: run(False, True), runs),
    }


def copy_floor(devices: list[str], items: list[np.ndarray], runs: int) -> Figures:
    """Items/s of the bytes alone: each item in, then out (see the module docstring)."""
    first, last = devices
    if first == "host":
        return _runs(lambda: _numpy_copies(items), runs)
    try:
        import torch
    except ImportError as exc:
        return {"skipped": f"torch is not installed ({exc})"}
    if first == last:
        return _runs(lambda: _torch_copies(torch, first, items), runs)
    if torch.cuda.device_count() < 2:
        return {"skipped": f"torch sees {torch.cuda.device_count()} GPU(s), needs two"}
    return _runs(lambda: _torch_copies_two(torch, first, last, items), runs)


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


def _torch_copies_two(torch: Any, first: str, last: str, items: list[np.ndarray]) -> float:
    """In on ``first``, a peer copy to ``last``, out from ``last``: three streams, a ring
    of buffers, each step after the previous one's event."""
    ring = 8
    src = [torch.from_numpy(items[i % len(items)]).pin_memory() for i in range(ring)]
    dst = [torch.empty_like(s).pin_memory() for s in src]
    on_first = [torch.empty(s.shape, dtype=s.dtype, device=first) for s in src]
    on_last = [torch.empty(s.shape, dtype=s.dtype, device=last) for s in src]
    h2d, d2h = torch.cuda.Stream(first), torch.cuda.Stream(last)
    peer_src, peer_dst = torch.cuda.Stream(first), torch.cuda.Stream(last)
    done = [torch.cuda.Event() for _ in range(ring)]
    for dev in (first, last):
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    for i in range(len(items)):
        k = i % ring
        with torch.cuda.stream(h2d):
            h2d.wait_event(done[k]) if i >= ring else None
            on_first[k].copy_(src[k], non_blocking=True)
            arrived = torch.cuda.Event()
            arrived.record(h2d)
        # torch copies between devices on the source's current stream, ordered by events
        # with the destination's current stream: both are the peer copy's own here
        with torch.cuda.stream(peer_src), torch.cuda.stream(peer_dst):
            peer_dst.wait_event(arrived)
            on_last[k].copy_(on_first[k], non_blocking=True)
            moved = torch.cuda.Event()
            moved.record(peer_dst)
        with torch.cuda.stream(d2h):
            d2h.wait_event(moved)
            dst[k].copy_(on_last[k], non_blocking=True)
            done[k].record(d2h)
    for dev in (last, first):
        torch.cuda.synchronize(dev)
    rate = len(items) / (time.perf_counter() - t0)
    assert torch.equal(dst[0], src[0])
    return float(rate)


def under_ray(devices: list[str], items: list[np.ndarray], runs: int) -> Figures:
    """Ray async actors, asynccube's and the same without it (see the module docstring)."""
    try:
        import ray
    except ImportError as exc:
        return {"skipped": f"ray is not installed ({exc})"}
    inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    path = os.pathsep.join([str(HERE.parent / "examples"), str(HERE.parent / "src"), *inherited])
    env = {"env_vars": {"PYTHONPATH": path, "NCCL_NVLS_ENABLE": "0"}}
    gpus = len({d for d in devices if d.startswith("cuda")})  # one actor per GPU on two
    ray.init(num_cpus=4, num_gpus=gpus, include_dashboard=False, log_to_driver=False,
             runtime_env=env)  # fmt: skip
    try:

        def run(plain: bool) -> float:
            out, rate = asyncio.run(rp.ray_pipeline(devices, items, plain=plain))
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
    first, last = args.devices
    peer = "torch" if first.startswith("cuda") else "numpy"
    rows = [
        ["one host, handles (`to_client`)", _rate(host["handles"]),
         _ratio(host["handles"], host["plain"]), _ratio(host["handles"], floor), "0.8x floor"],
        ["one host, handles, items in and out of `staging` buffers", _rate(host["staged"]),
         _ratio(host["staged"], host["plain"]), _ratio(host["staged"], floor), "-"],
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
    two = first != last
    moves = "in, peer copy, out" if two else "in, then out"
    rows.append([f"copy floor ({moves}, pinned)", _rate(floor), "-", "1.00x", "-"])
    body = table(["pipeline", "items/s (spread)", "vs without asynccube", "vs copy floor",
                  "goal"], rows)  # fmt: skip
    where = f"stage 1 on {first}, stage 2 on {last}" if two else f"on {first}"
    floor_how = (
        f"into {first} from pinned host buffers, peer-copied to {last} and out of it into "
        "pinned buffers, on three streams (torch)"
        if two
        else "in and out of the device from pinned host buffers on two streams (torch)"
        if peer == "torch"
        else "in and out of a second array (two `np.copyto`)"
    )
    flag = f"--devices {first},{last}" if two else f"--device {first}"
    how = (
        f"Two stages (`y = 2x + 1`, then `z = y / 2 - 1`), {args.items} items of "
        f"{4 * args.size // 1024} KiB float32, {where}, {args.runs} runs (median, "
        f"lowest-highest). The copy floor moves each item's bytes {floor_how}, the least "
        "any pipeline that takes numpy in and gives numpy out can cost. Command: `python "
        f"benchmarks/bench_pipeline.py {flag} --items {args.items} --size {args.size} "
        f"--runs {args.runs}`."
    )
    return f"{body}\n\n{how}"


def _devices(p: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The stages' devices: ``--devices A,B``, else ``--device`` twice; both host or
    both CUDA (the copy floor and the peer know no mixed pair)."""
    if args.devices is None:
        return [args.device, args.device]
    devices = [d.strip() for d in args.devices.split(",")]
    if len(devices) != 2:
        p.error(f"--devices takes two devices, comma-separated (got {args.devices!r})")
    if len({d.startswith("cuda") for d in devices}) != 1:
        p.error("--devices: both host or both cuda:N")
    return devices


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="host", help="both stages on this device")
    p.add_argument("--devices", help="two devices, comma-separated: a stage on each")
    p.add_argument("--items", type=int, default=256)
    p.add_argument("--size", type=int, default=1 << 20, help="float32 elements per item")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-ray", action="store_true", help="skip the Ray part")
    p.add_argument("--json-only", action="store_true", help="print, write nothing")
    args = p.parse_args()
    if args.items < 4 or args.size < 1 or args.runs < 1:
        p.error("--items must be >= 4, --size and --runs >= 1")
    args.devices = _devices(p, args)
    devices = args.devices
    items = rp.make_items(args.items, args.size)
    figs: Figures = {"copy_floor": copy_floor(devices, items, args.runs)}
    print("copy floor", figs["copy_floor"], flush=True)
    figs["one_host"] = one_host(devices, items, args.runs)
    print("one host", figs["one_host"], flush=True)
    figs["ray"] = {"skipped": "--no-ray"} if args.no_ray else under_ray(devices, items, args.runs)
    print(render(figs, args))
    if args.json_only:
        print(json.dumps(figs | {"args": vars(args)}))
    else:
        host, two = devices[0] == "host", devices[0] != devices[1]
        name = "pipeline_host" if host else ("pipeline_2gpu" if two else "pipeline")
        on = ",".join(devices) if two else devices[0]
        title = f"The example pipeline on {on} ({'issue 32' if two else 'issue 30'})"
        device = "" if host else on
        write(name, title, environment(device), render(figs, args), figs | {"args": vars(args)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
