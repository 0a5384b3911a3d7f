"""A two-stage pipeline of async actors, one per device, each owning an asynccube client.

Stage 1 computes ``y = 2 x + 1``, stage 2 computes ``z = y / 2 - 1`` (so ``z == x - 0.5``),
each with a kernel on its own device. Arrays travel between stages as numpy arrays
through Ray's object store; on one host (the plain-asyncio driver) they can instead
travel as device handles, copied by ``client.to_client`` (P2P between GPUs).

    python examples/ray_pipeline.py --devices host,host --ray       # a local Ray cluster
    python examples/ray_pipeline.py --devices cuda:0,cuda:1         # plain asyncio, handles
    python examples/ray_pipeline.py --devices cuda:0,cuda:1 --numpy # plain asyncio, numpy

The same actor classes run under both drivers: with ``--ray`` each is a Ray async actor
(its methods run on the actor's event loop, where its client lives); without it, they
are plain objects on this process's loop. ``PlainStage`` is the same pipeline without
asynccube (numpy on the host, torch on a GPU), for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

import asynccube as ac


def _axpb_host(launch: ac.HostLaunch) -> None:
    (x,) = (buf.view(np.float32) for buf in launch.buffers)
    a, b = launch.scalars[np.dtype(np.float32)]
    n = int(launch.scalar(np.uint32))
    x[:n] = x[:n] * a + b


AXPB = ac.Kernel(
    "example_axpb_f32",
    host=_axpb_host,
    cuda=ac.CudaSource(
        r"""extern "C" __global__ void axpb(float* x, float a, float b, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] = x[i] * a + b; }""",
        entry="axpb",
    ),
)
STAGES = ((2.0, 1.0), (0.5, -1.0))
"""(a, b) of each stage: x -> a x + b."""


class Stage:
    """One pipeline stage: an asynccube client on ``device`` running ``x -> a x + b``.

    Call :meth:`start` first (on the loop the stage lives on: the actor's under Ray).
    """

    def __init__(self, device: str, a: float, b: float) -> None:
        self.device, self.a, self.b = device, a, b
        self.client: ac.ComputeClient | None = None

    async def start(self) -> str:
        """Open the client; returns its device."""
        self.client = await ac.connect(self.device)
        return self.client.device

    def _run(self, h: ac.Handle, n: int) -> None:
        assert self.client is not None, "call start() first"
        bindings = ac.Bindings().with_buffer(h).with_scalar(np.float32, [self.a, self.b])
        self.client.execute(AXPB, ac.CubeCount(-(-n // 256)), bindings.with_scalar(np.uint32, [n]))

    async def process(self, x: np.ndarray) -> np.ndarray:
        """numpy in, numpy out (the object-store path)."""
        assert self.client is not None, "call start() first"
        h = self.client.create(x)
        self._run(h, x.size)
        return await self.client.read_array(h, np.float32)

    def process_handle(self, h: ac.Handle, n: int, source: Stage | None = None) -> ac.Handle:
        """A handle in, a handle out (the one-host path): a handle of another stage is
        first copied to this stage's client with ``to_client``."""
        assert self.client is not None, "call start() first"
        if source is not None:
            assert source.client is not None
            h = source.client.to_client(h, self.client)
        self._run(h, n)
        return h

    async def close(self) -> None:
        """Close the client."""
        if self.client is not None:
            await self.client.close()


class PlainStage:
    """The same stage without asynccube: numpy on the host, torch on a GPU."""

    def __init__(self, device: str, a: float, b: float) -> None:
        self.device, self.a, self.b = device, a, b

    async def start(self) -> str:
        """Nothing to open (torch initializes lazily); returns the device."""
        return self.device

    async def process(self, x: np.ndarray) -> np.ndarray:
        """numpy in, numpy out."""
        if self.device == "host":
            return x * np.float32(self.a) + np.float32(self.b)
        torch: Any = importlib.import_module("torch")  # only the GPU peer needs it

        def work() -> np.ndarray:  # in a thread: torch blocks, and sets its device there
            t = torch.from_numpy(x).to(self.device)
            t.mul_(self.a).add_(self.b)
            out: np.ndarray = t.cpu().numpy()
            return out

        return await asyncio.to_thread(work)

    async def close(self) -> None:
        """Nothing to close."""


Call = Callable[..., Awaitable[Any]]


async def run_numpy(calls: Sequence[Call], items: list[np.ndarray], window: int = 8) -> list[Any]:
    """Push every item through the stages (numpy between them), ``window`` in flight."""
    sem = asyncio.Semaphore(window)

    async def one(x: np.ndarray) -> Any:
        async with sem:
            y: Any = x
            for call in calls:
                y = await call(y)
            return y

    return await asyncio.gather(*(one(x) for x in items))


async def run_handles(
    stages: Sequence[Stage], items: list[np.ndarray], outs: list[np.ndarray] | None = None
) -> list[np.ndarray]:
    """One host: each item is created on the first stage's device and handed on as a
    device handle (``to_client``); only the result is read back, into ``outs[i]`` when
    given (``read_into``: memory the caller keeps, no new array per item)."""
    first, last = stages[0], stages[-1]
    assert first.client is not None
    assert last.client is not None

    async def one(i: int, x: np.ndarray) -> np.ndarray:
        assert first.client is not None
        assert last.client is not None
        n = x.nbytes // 4  # float32 elements (a staging buffer is a uint8 array)
        h = first.process_handle(first.client.create(x), n)
        prev = first
        for stage in stages[1:]:
            h = stage.process_handle(h, n, prev)
            prev = stage
        if outs is None:
            return await last.client.read_array(h, np.float32)
        await last.client.read_into(h, outs[i])
        return outs[i]

    return list(await asyncio.gather(*(one(i, x) for i, x in enumerate(items))))


async def local_pipeline(
    devices: Sequence[str],
    items: list[np.ndarray],
    *,
    handles: bool,
    plain: bool = False,
    staged: bool = False,
) -> tuple[list[np.ndarray], float]:
    """The plain-asyncio driver: the stages are objects on this loop. Returns the
    results and items per second. ``staged`` (with ``handles``): the items are copied
    into the first client's ``staging`` buffers before the clock starts, and the results
    read into the last client's (page-locked on CUDA: the device copies straight from
    and into them, no host copy at all), as data that arrives in pinned memory would."""
    kind = PlainStage if plain else Stage
    stages = [kind(d, a, b) for d, (a, b) in zip(devices, STAGES, strict=True)]
    for stage in stages:
        await stage.start()
    try:
        await run_numpy([s.process for s in stages], items[:2])  # warm up
        inputs, outs = items, None
        if handles and not plain:  # the results land in arrays made (and touched) up front
            inputs, outs = await _buffers(stages, items, staged)
        t0 = time.perf_counter()
        if outs is not None:
            await run_handles(stages, inputs, outs)  # type: ignore[arg-type]
            out = [o.view(np.float32) for o in outs]
        else:
            out = await run_numpy([s.process for s in stages], items)
        return out, len(items) / (time.perf_counter() - t0)
    finally:
        for stage in stages:
            await stage.close()


async def _buffers(
    stages: Sequence[Any], items: list[np.ndarray], staged: bool
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The inputs and the result buffers of ``run_handles``: the items and new arrays,
    or (``staged``) staging buffers of the first and the last client."""
    if not staged:
        return items, [np.ones_like(x) for x in items]
    sizes = [x.nbytes for x in items]
    inputs = await stages[0].client.staging(sizes)
    for buf, x in zip(inputs, items, strict=True):
        np.copyto(buf, x.view(np.uint8).reshape(-1))
    outs = await stages[-1].client.staging(sizes)
    for buf in outs:
        buf.fill(1)  # touched up front, as the arrays of the other runs are
    return inputs, outs


async def ray_pipeline(
    devices: Sequence[str], items: list[np.ndarray], *, plain: bool = False
) -> tuple[list[np.ndarray], float]:
    """The Ray driver: one async actor per stage; numpy through the object store.
    Needs ``ray.init()`` first. Returns the results and items per second."""
    import ray

    kind: Any = ray.remote(PlainStage if plain else Stage)
    actors: list[Any] = [
        kind.options(max_concurrency=8, **_gpus(d, devices)).remote(_visible(d), a, b)
        for d, (a, b) in zip(devices, STAGES, strict=True)
    ]
    await asyncio.gather(*(a.start.remote() for a in actors))
    try:

        def chain(x: Any) -> Any:
            for actor in actors:
                x = actor.process.remote(x)  # an ObjectRef feeds the next stage directly
            return x

        await asyncio.gather(*(chain(x) for x in items[:2]))
        t0 = time.perf_counter()
        out = await asyncio.gather(*(chain(x) for x in items))
        return list(out), len(items) / (time.perf_counter() - t0)
    finally:
        await asyncio.gather(*(a.close.remote() for a in actors))
        for actor in actors:
            ray.kill(actor)


def _gpus(device: str, devices: Sequence[str]) -> dict[str, float]:
    """Ray's resource request of a stage on ``device``: its share of one GPU (the
    stages on the same device share it), nothing on the host."""
    if not device.startswith("cuda"):
        return {}
    return {"num_gpus": 1 / devices.count(device)}


def _visible(device: str) -> str:
    """The device as the actor sees it: Ray shows a GPU actor only its own GPU, as
    ``cuda:0``."""
    return "cuda:0" if device.startswith("cuda") else device


def make_items(count: int, size: int) -> list[np.ndarray]:
    """``count`` float32 arrays of ``size`` elements."""
    rng = np.random.default_rng(0)
    return [rng.random(size, dtype=np.float32) for _ in range(count)]


def check(items: list[np.ndarray], out: list[np.ndarray]) -> None:
    """Every result must be ``x - 0.5``."""
    for x, z in zip(items, out, strict=True):
        np.testing.assert_allclose(z, x - 0.5, rtol=1e-6, atol=1e-6)


async def main(argv: Sequence[str] | None = None) -> None:
    """Run the pipeline once with asynccube and once without, print items/s."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", default="host,host", help="two devices, comma-separated")
    p.add_argument("--items", type=int, default=64)
    p.add_argument("--size", type=int, default=1 << 16, help="float32 elements per item")
    p.add_argument("--ray", action="store_true", help="run the stages as Ray actors")
    p.add_argument("--numpy", action="store_true", help="pass numpy even on one host")
    args = p.parse_args(argv)
    devices = args.devices.split(",")
    items = make_items(args.items, args.size)
    if args.ray:
        import ray

        gpus = len({d for d in devices if d.startswith("cuda")})
        ray.init(num_cpus=2, num_gpus=gpus, include_dashboard=False)
        try:
            out, rate = await ray_pipeline(devices, items)
            check(items, out)
            _, plain = await ray_pipeline(devices, items, plain=True)
        finally:
            ray.shutdown()
    else:
        out, rate = await local_pipeline(devices, items, handles=not args.numpy)
        check(items, out)
        _, plain = await local_pipeline(devices, items, handles=False, plain=True)
    mode = "ray" if args.ray else ("numpy" if args.numpy else "handles")
    print(f"{devices} {mode}: asynccube {rate:.0f} items/s, without asynccube {plain:.0f} items/s")


if __name__ == "__main__":
    asyncio.run(main())
