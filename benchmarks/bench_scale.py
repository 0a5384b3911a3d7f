"""Scale benchmarks (issue 14): graphs, to_client between GPUs, a two-stage pipeline.

    python benchmarks/bench_scale.py [graphs] [to_client] [pipeline] [ray] [--device D]

* graphs: host µs per kernel of a 100-kernel sequence, eager ``execute`` vs
  ``graph.replay()``, beside torch eager and ``torch.cuda.CUDAGraph.replay()`` on the
  same sequence (``x.mul_``, one kernel each; on CUDA devices);
* to_client: 256 MiB ``cuda:0 -> cuda:1`` (GB/s) beside ``torch.Tensor.to("cuda:1")``
  and a raw ``cuMemcpyPeerAsync`` (needs two GPUs);
* pipeline: items/s through ``examples/ray_pipeline.py``'s two stages under the
  plain-asyncio driver (handles and numpy between stages), beside the same pipeline
  without asynccube (numpy / torch); on ``host,host`` and, with two GPUs,
  ``cuda:0,cuda:1``;
* ray: the same on a local Ray cluster (``ray.init(num_cpus=2)``), host actors.

Each section writes ``results/scale-<section>.json``; ``results/scale.md`` is rebuilt
from all of them (so sections measured on different machines join), and
``python benchmarks/report.py`` puts it into RESULTS.md. Copies go to ``$OUT`` if set.
torch runs in a worker thread, so it never changes the loop thread's CUDA context.
"""

from __future__ import annotations

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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "examples"))

from _common import RESULTS, environment, table  # noqa: E402

import asynccube as ac  # noqa: E402

KERNELS = 100
MiB = 1 << 20
SCALE = ac.Kernel(
    "bench_scale_f32",
    host=lambda launch: None,
    cuda=ac.CudaSource(
        r"""extern "C" __global__ void scale(float* x, float f, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= f; }""",
        entry="scale",
    ),
)


def _bindings(h: ac.Handle, n: int) -> ac.Bindings:
    return ac.Bindings().with_buffer(h).with_scalar(np.float32, [1.0]).with_scalar(np.uint32, [n])


async def graphs(device: str) -> dict[str, Any]:
    """Host µs per kernel, eager vs replay, and torch beside."""
    n = 1024
    async with ac.open_client(device) as client:
        h = client.create(np.ones(n, np.float32))
        b, count = _bindings(h, n), ac.CubeCount(4)
        eager = []
        for _ in range(30):
            t0 = time.perf_counter()
            for _ in range(KERNELS):
                client.execute(SCALE, count, b)
            eager.append((time.perf_counter() - t0) / KERNELS * 1e6)
            await client.sync()
        async with client.capture() as graph:
            for _ in range(KERNELS):
                client.execute(SCALE, count, b)
        replay = []
        for _ in range(200):
            t0 = time.perf_counter()
            graph.replay()
            replay.append((time.perf_counter() - t0) / KERNELS * 1e6)
            await client.sync()
        out = {"device": client.device, "eager_us": med(eager), "replay_us": med(replay)}
    out["ratio"] = out["eager_us"] / out["replay_us"]
    if device.startswith("cuda"):
        out.update(await asyncio.to_thread(_torch_graphs, n))
    return out


def _torch_graphs(n: int) -> dict[str, Any]:
    try:
        import torch
    except ImportError as exc:
        return {"torch": f"n/a ({exc})"}
    x = torch.ones(n, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            x.mul_(1.0)
    torch.cuda.current_stream().wait_stream(s)
    eager = []
    for _ in range(30):
        t0 = time.perf_counter()
        for _ in range(KERNELS):
            x.mul_(1.0)
        eager.append((time.perf_counter() - t0) / KERNELS * 1e6)
        torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(KERNELS):
            x.mul_(1.0)
    replay = []
    for _ in range(200):
        t0 = time.perf_counter()
        g.replay()
        replay.append((time.perf_counter() - t0) / KERNELS * 1e6)
        torch.cuda.synchronize()
    del g  # destroyed now, while the context is surely alive
    torch.cuda.synchronize()
    return {
        "torch": torch.__version__,
        "torch_eager_us": med(eager),
        "torch_replay_us": med(replay),
    }


_WARM = 5
"""Rounds run before timing: peer access, the first page, the copy paths warm up."""


async def to_client(size: int = 256 * MiB, rounds: int = 30) -> dict[str, Any]:
    """GB/s of a 256 MiB to_client cuda:0 -> cuda:1, torch .to() and raw peer copy."""
    async with ac.open_client("cuda:0") as c0, ac.open_client("cuda:1") as c1:
        h = c0.empty(size)
        await c0.sync()
        times = []
        for i in range(rounds + _WARM):
            t0 = time.perf_counter()
            copy = c0.to_client(h, c1)
            await c1.sync()
            if i >= _WARM:
                times.append(time.perf_counter() - t0)
            del copy
        await c0.sync()
        out: dict[str, Any] = {"asynccube_gbps": size / med(times) / 1e9}
    out.update(await asyncio.to_thread(_torch_copy, size, rounds))
    out.update(await asyncio.to_thread(_raw_peer, size, rounds))
    if "torch_gbps" in out:
        out["vs_torch"] = out["asynccube_gbps"] / out["torch_gbps"]
    return out


def _torch_copy(size: int, rounds: int) -> dict[str, Any]:
    try:
        import torch
    except ImportError as exc:
        return {"torch": f"n/a ({exc})"}
    x = torch.empty(size, dtype=torch.uint8, device="cuda:0")
    times = []
    for i in range(rounds + _WARM):
        torch.cuda.synchronize("cuda:0")
        t0 = time.perf_counter()
        y = x.to("cuda:1")
        torch.cuda.synchronize("cuda:1")
        if i >= _WARM:
            times.append(time.perf_counter() - t0)
        del y
    return {"torch_gbps": size / med(times) / 1e9}


def _raw_peer(size: int, rounds: int) -> dict[str, Any]:
    from asynccube._core.cuda.driver import check, cu

    d = cu()
    check(d.cuInit(0))
    devs = [check(d.cuDeviceGet(i)) for i in (0, 1)]
    ctxs = [check(d.cuDevicePrimaryCtxRetain(dev)) for dev in devs]
    bufs = []
    for ctx in ctxs:
        check(d.cuCtxSetCurrent(ctx))
        bufs.append(check(d.cuMemAlloc(size)))
    stream = check(d.cuStreamCreate(1))
    times = []
    for i in range(rounds + _WARM):
        t0 = time.perf_counter()
        check(d.cuMemcpyPeerAsync(bufs[1], ctxs[1], bufs[0], ctxs[0], size, stream))
        check(d.cuStreamSynchronize(stream))
        if i >= _WARM:
            times.append(time.perf_counter() - t0)
    check(d.cuStreamDestroy(stream))
    for ctx, buf in zip(ctxs, bufs, strict=True):
        check(d.cuCtxSetCurrent(ctx))
        check(d.cuMemFree(buf))
    for dev in devs:
        check(d.cuDevicePrimaryCtxRelease(dev))
    return {"raw_peer_gbps": size / med(times) / 1e9}


async def pipeline(devices: list[str], items: int, size: int) -> dict[str, Any]:
    """items/s through the example's two stages, plain-asyncio driver."""
    import ray_pipeline as rp

    data = rp.make_items(items, size)
    out, handles = await rp.local_pipeline(devices, data, handles=True)
    rp.check(data, out)
    out, numpy = await rp.local_pipeline(devices, data, handles=False)
    rp.check(data, out)
    out, plain = await rp.local_pipeline(devices, data, handles=False, plain=True)
    rp.check(data, out)
    return {
        "devices": devices,
        "items": items,
        "item_bytes": 4 * size,
        "handles_per_s": handles,
        "numpy_per_s": numpy,
        "plain_per_s": plain,
    }


async def ray_host(items: int, size: int) -> dict[str, Any]:
    """items/s through the example's two stages as Ray actors on host servers."""
    import ray
    import ray_pipeline as rp

    data = rp.make_items(items, size)
    path = os.pathsep.join([str(ROOT / "examples"), str(ROOT / "src")])
    env = {"env_vars": {"PYTHONPATH": path}}  # the actors import the example by name
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env=env)
    try:
        out, rate = await rp.ray_pipeline(["host", "host"], data)
        rp.check(data, out)
        _, plain = await rp.ray_pipeline(["host", "host"], data, plain=True)
    finally:
        ray.shutdown()
    return {"items": items, "item_bytes": 4 * size, "ray_per_s": rate, "ray_plain_per_s": plain}


def med(xs: list[float]) -> float:
    """The median."""
    return statistics.median(xs)


def _save(name: str, figures: dict[str, Any]) -> None:
    RESULTS.mkdir(exist_ok=True)
    data = {"environment": environment(figures.pop("env_device", "")), **figures}
    text = json.dumps(data, indent=2)
    (RESULTS / f"scale-{name}.json").write_text(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"scale-{name}.json").write_text(text)
    print(name, text)


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"scale-{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _f(v: Any, fmt: str = ".2f") -> str:
    return format(v, fmt) if isinstance(v, int | float) else "n/a"


def markdown() -> str:
    """The RESULTS.md section, from every scale-*.json present."""
    parts = ["## Scale: graphs, several GPUs, pipelines (issue 14)\n"]
    rows: list[list[str]] = []
    for key in ("graphs-cuda", "graphs-host"):
        g = _load(key)
        if g is None:
            continue
        env = g["environment"]
        rows.append(
            [
                f"100-kernel sequence, host µs per kernel ({g['device']})",
                f"eager {_f(g['eager_us'])}, replay {_f(g['replay_us'], '.3f')} "
                f"({_f(g['ratio'], '.0f')}x)",
                ">= 10x" if key == "graphs-cuda" else "-",
                f"torch eager {_f(g.get('torch_eager_us'))}, CUDAGraph.replay "
                f"{_f(g.get('torch_replay_us'), '.3f')}",
                f"{env['date']}, {env['device']}",
            ]
        )
    t = _load("to_client")
    if t is not None:
        rows.append(
            [
                "to_client 256 MiB cuda:0 -> cuda:1 (GB/s)",
                _f(t["asynccube_gbps"], ".1f"),
                ">= 90% of torch",
                f"torch .to {_f(t.get('torch_gbps'), '.1f')} "
                f"({_f(100 * t.get('vs_torch', 0), '.0f')}%), raw cuMemcpyPeerAsync "
                f"{_f(t.get('raw_peer_gbps'), '.1f')}",
                f"{t['environment']['date']}, {t['environment']['device']}",
            ]
        )
    for key in ("pipeline-cuda", "pipeline-host"):
        p = _load(key)
        if p is not None:
            rows.append(
                [
                    f"two-stage pipeline {','.join(p['devices'])}, {p['item_bytes'] // 1024} "
                    "KiB items (items/s)",
                    f"handles {_f(p['handles_per_s'], '.0f')}, numpy {_f(p['numpy_per_s'], '.0f')}",
                    "-",
                    f"without asynccube {_f(p['plain_per_s'], '.0f')}",
                    f"{p['environment']['date']}, {p['environment']['device']}",
                ]
            )
    r = _load("ray")
    if r is not None:
        rows.append(
            [
                f"Ray two-stage pipeline, host actors, {r['item_bytes'] // 1024} KiB items "
                "(items/s)",
                _f(r["ray_per_s"], ".0f"),
                "-",
                f"without asynccube {_f(r['ray_plain_per_s'], '.0f')}",
                f"{r['environment']['date']}, {r['environment']['cpu']}",
            ]
        )
    parts.append(table(["figure", "asynccube", "goal", "peer, same run", "run"], rows))
    parts.append(
        "\nCommand: `python benchmarks/bench_scale.py [graphs] [to_client] [pipeline] [ray] "
        "[--device D]` (GPU sections through `scripts/gpu-check`).\n"
    )
    return "\n".join(parts)


async def _main(argv: list[str]) -> None:
    device = "cuda:0"
    if "--device" in argv:
        device = argv[argv.index("--device") + 1]
    wanted = [a for a in argv if a in ("graphs", "to_client", "pipeline", "ray")]
    wanted = wanted or ["graphs", "to_client", "pipeline"]
    cuda = device.startswith("cuda")
    runs: dict[str, Callable[[], Any]] = {
        "graphs": lambda: graphs(device),
        "to_client": to_client,
        "pipeline": lambda: pipeline(
            ["cuda:0", "cuda:1"] if cuda else ["host", "host"], 64, MiB if cuda else 1 << 16
        ),
        "ray": lambda: ray_host(64, 1 << 16),
    }
    for name in wanted:
        label = name if name in ("to_client", "ray") else f"{name}-{'cuda' if cuda else 'host'}"
        try:
            figures = await runs[name]()
        except Exception as exc:  # a missing GPU or package: say so, go on
            print(f"{name}: skipped ({type(exc).__name__}: {exc})")
            continue
        figures["env_device"] = _gpu_name() if cuda and name != "ray" else ""
        _save(label, figures)
    _write_markdown()


def _write_markdown() -> None:
    md = markdown()
    (RESULTS / "scale.md").write_text(md)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "scale.md").write_text(md)
    print(md)


def _gpu_name() -> str:
    try:
        from asynccube._core.cuda.driver import list_devices

        devs = list_devices()
        return f"{len(devs)}x {devs[0].split(None, 1)[1]}" if devs else ""
    except Exception:
        return ""


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1:]))
