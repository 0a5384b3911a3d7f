"""A GPU web service on asynccube and FastAPI (or plain Starlette): float32 values in,
``2x + 1`` out. The same service as ``gpu_service.py`` (aiohttp), written the ASGI way.

    uvicorn --app-dir examples fastapi_service:app --port 8080
    uvicorn --app-dir examples fastapi_service:app --port 8080 --workers 2
    GPU_SERVICE_DEVICE=host uvicorn --app-dir examples fastapi_service:starlette_app

    curl -s http://127.0.0.1:8080/health
    python -c "import numpy as np; np.arange(4, dtype=np.float32).tofile('x.f32')"
    curl -s --data-binary @x.f32 -H 'Content-Type: application/octet-stream' \\
        http://127.0.0.1:8080/y | python -c "import numpy as np, sys; \\
        print(np.frombuffer(sys.stdin.buffer.read(), np.float32))"   # [1. 3. 5. 7.]

``POST /y`` takes a body of float32 values (``Content-Type: application/octet-stream``)
and answers ``2x + 1`` in the same form. ``GET /health`` answers JSON: the device, the
worker's pid, the requests served, refused (by status), cancelled and in flight, and the
event loop's health (``ac.LoopMonitor``: lag percentiles, the slowest step and its
culprit). ``GPU_SERVICE_DEVICE`` (``host``, ``cuda:0``...; default: cuda:0 where
usable, else the host server) and ``GPU_SERVICE_MAX_BYTES`` configure the module's
``app`` and ``starlette_app``; :func:`create_app` takes them as arguments.

What Starlette (and so FastAPI) does not do by itself, this service does:

* **One client per worker process**, opened and warmed up by the lifespan before the
  first request (``client.warm_up()``: the kernels compile there, not in the first
  request; ``--workers 2``: two processes, two clients) and closed when the worker stops: on
  SIGTERM, uvicorn runs the lifespan's end, which closes the client dropping the work
  not yet issued to the device and waiting at most ``shutdown_after`` seconds (5) for
  the rest (``close(cancel_pending=True, abandon_after=5.0)``).
* **A typed dependency**: ``client: ClientDep`` gives a handler the ``ComputeClient``
  (``request.app.state`` is typed ``Any``).
* **Bad input is refused** with a status and one line of JSON, ``{"error": "..."}``:
  415 for another content type, 400 for an empty body or a length that is not a
  multiple of 4, 413 for a body over the limit (told by its Content-Length before a byte
  is read, or counted as a chunked body arrives: Starlette has no body limit), 408 for
  a body that does not arrive within ``body_timeout`` seconds.
* **A request whose work is dropped at shutdown** (``ClientClosedError``) gets a 503.
* **A client that disconnects** has its request's GPU work cancelled: Starlette does not
  cancel a handler whose client left, so the handler awaits its work beside the ASGI
  ``http.disconnect`` message and cancels the work when that comes first. The awaited
  ``client.read`` is cancelled and the request's buffers go back to the pool once the
  device is done with them.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

import numpy as np
from fastapi import Depends, FastAPI
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import asynccube as ac

CONTENT_TYPE = "application/octet-stream"
ELEMENT = 4
"""Bytes per value (float32)."""
BLOCK = 256
"""Threads per cube of the CUDA kernel."""
log = logging.getLogger("uvicorn.error")  # the server's log: lines join uvicorn's own

Y2X1_SRC = r"""
extern "C" __global__ void y2x1(const float* x, float* y, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i] + 1.0f;
}
"""


def _y2x1_host(launch: ac.HostLaunch) -> None:
    x, y = launch.buffers[0].view(np.float32), launch.buffers[1].view(np.float32)
    n = int(launch.scalar(np.uint32))
    np.multiply(x[:n], np.float32(2), out=y[:n])
    y[:n] += np.float32(1)


Y2X1 = ac.Kernel(
    "example_asgi_service_y2x1",
    cuda=ac.CudaSource(Y2X1_SRC, "y2x1", (BLOCK, 1, 1)),
    host=_y2x1_host,
)
Compute = Callable[[ac.ComputeClient, bytes], Awaitable[bytes]]
"""What a request computes: the client and the body's bytes in, the answer's bytes out."""
T = TypeVar("T")


async def y2x1(client: ac.ComputeClient, body: bytes) -> bytes:
    """``2x + 1`` of the float32 values in ``body``, computed on the client's device."""
    n = len(body) // ELEMENT
    x, y = client.create(body), client.empty(len(body))
    bindings = ac.Bindings().with_buffers([x, y]).with_scalar(np.uint32, [n])
    client.execute(Y2X1, ac.CubeCount(-(-n // BLOCK)), bindings)
    (out,) = await client.read([y])  # the loop serves the other requests meanwhile
    return out


@dataclass(frozen=True)
class Limits:
    """What the service accepts: the largest body in bytes, and how many seconds a
    request's body may take to arrive; and how many seconds its shutdown waits for work
    issued to the device before abandoning it."""

    max_bytes: int = 16 << 20
    body_timeout: float = 10.0
    shutdown_after: float = 5.0

    def __post_init__(self) -> None:
        if not 0 < self.max_bytes < ELEMENT << 32:  # n must fit the kernel's uint32
            raise ValueError(f"max_bytes must be in 1..{(ELEMENT << 32) - 1}, got {self.max_bytes}")
        if not self.body_timeout > 0:
            raise ValueError(f"body_timeout must be > 0 seconds, got {self.body_timeout}")


class Refused(Exception):
    """A request answered with an error ``status`` and a one-line JSON ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message

    def response(self) -> JSONResponse:
        """The answer: ``{"error": message}`` with the status."""
        return JSONResponse({"error": self.message}, status_code=self.status)


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


def _check_length(size: int, limits: Limits) -> None:
    if size > limits.max_bytes:
        raise Refused(413, f"the body has {size} bytes, over the limit of {limits.max_bytes}")
    if size == 0:
        raise Refused(400, "the body is empty: send float32 values")
    if size % ELEMENT:
        raise Refused(400, f"the body has {size} bytes, not a multiple of {ELEMENT} (float32)")


async def _read_at_most(request: Request, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Refused(413, f"the body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_body(request: Request, limits: Limits) -> bytes:
    """The request's body, checked; raises :class:`Refused` saying what is wrong, or
    :class:`ClientGone` when the client disconnects while it arrives."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != CONTENT_TYPE:
        raise Refused(415, f"Content-Type must be {CONTENT_TYPE}, got {content_type!r}")
    length = request.headers.get("content-length")
    if length is not None:  # refused before a byte of the body is read
        if not length.isdigit():
            raise Refused(400, f"Content-Length must be a number of bytes, got {length!r}")
        _check_length(int(length), limits)
    try:
        async with asyncio.timeout(limits.body_timeout):
            body = await _read_at_most(request, limits.max_bytes)
    except TimeoutError:
        raise Refused(408, f"the body did not arrive within {limits.body_timeout:g} s") from None
    except ClientDisconnect:
        raise ClientGone from None
    _check_length(len(body), limits)
    return body


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` (its body read already); cancel it and raise :class:`ClientGone`
    if the client disconnects first (Starlette does not cancel the handler)."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()  # the client left (or the handler was cancelled): drop the work
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientGone
    return task.result()


@dataclass
class Counts:
    """The requests served, refused (per status), cancelled and in flight."""

    served: int = 0
    cancelled: int = 0
    in_flight: int = 0
    refused: dict[int, int] = field(default_factory=dict)


class Service:
    """The service's state: its client (open while the app runs), limits, counts and the
    loop monitor."""

    def __init__(self, device: str | None, limits: Limits, compute: Compute) -> None:
        self.device, self.limits, self.compute = device, limits, compute
        self.counts = Counts()
        self.monitor = ac.LoopMonitor()
        self._client: ac.ComputeClient | None = None

    @property
    def client(self) -> ac.ComputeClient:
        """The client, while the app runs."""
        if self._client is None:
            raise RuntimeError("the service is not running")
        return self._client

    @asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        """Opens the client and warms it up before the first request (the computation
        runs once under ``client.warm_up()``: its kernels are compiled and loaded,
        nothing runs on the device); closes it when the worker stops, dropping the work
        not yet issued to the device."""
        client = await ac.connect(self.device)
        try:
            async with client.warm_up() as warm:  # a failed compile raises WarmUpError
                await self.compute(client, bytes(ELEMENT))  # ends at its read of y
            self._client = client
            self.monitor.start()
            log.info(
                "worker %d: client open on %s (warm-up: %d kernel(s), %d compiled, "
                "%d from the cache)",
                os.getpid(), client.device, warm.kernels, warm.compiled, warm.from_cache,
            )  # fmt: skip
            yield
        finally:
            self.monitor.stop()
            self._client = None
            await client.close(cancel_pending=True, abandon_after=self.limits.shutdown_after)
            log.info("worker %d: client closed", os.getpid())

    async def post_y(self, request: Request) -> Response:
        """``POST /y``: float32 values in, the computed values out."""
        counts = self.counts
        counts.in_flight += 1
        try:
            body = await read_body(request, self.limits)
            out = await until_disconnected(request, self.compute(self.client, body))
        except Refused as refused:
            counts.refused[refused.status] = counts.refused.get(refused.status, 0) + 1
            return refused.response()
        except ClientGone:  # nobody reads the answer
            counts.cancelled += 1
            return Response(status_code=499)
        except ac.ClientClosedError:  # shutting down: its work was dropped or abandoned
            counts.refused[503] = counts.refused.get(503, 0) + 1
            return Refused(503, "the service is shutting down; retry elsewhere").response()
        finally:
            counts.in_flight -= 1
        counts.served += 1
        return Response(out, media_type=CONTENT_TYPE)

    async def health(self, request: Request) -> JSONResponse:
        """``GET /health``: the device, the counts and the loop's health."""
        c = self.counts
        return JSONResponse({"status": "ok", "device": self.client.device, "pid": os.getpid(),
                             "served": c.served, "refused": c.refused, "cancelled": c.cancelled,
                             "in_flight": c.in_flight,
                             "loop": self.monitor.snapshot().as_dict()})  # fmt: skip


def service_of(request: Request) -> Service:
    """The app's :class:`Service` (a dependency: ``app.state`` is typed ``Any``)."""
    service: Service = request.app.state.service
    return service


def compute_client(service: Annotated[Service, Depends(service_of)]) -> ac.ComputeClient:
    """The worker's ``ComputeClient`` (a dependency)."""
    return service.client


ServiceDep = Annotated[Service, Depends(service_of)]
ClientDep = Annotated[ac.ComputeClient, Depends(compute_client)]
"""A handler's parameter ``client: ClientDep`` is the worker's ``ComputeClient``."""


def create_app(
    device: str | None = None, limits: Limits | None = None, compute: Compute = y2x1
) -> FastAPI:
    """The FastAPI application: ``POST /y`` and ``GET /health`` on a client of ``device``
    (``None``: cuda:0 where usable, else the host server)."""
    service = Service(device, limits or Limits(), compute)
    app = FastAPI(lifespan=service.lifespan)
    app.state.service = service

    @app.post("/y")
    async def post_y(request: Request, service: ServiceDep) -> Response:
        return await service.post_y(request)

    @app.get("/health")
    async def health(request: Request, service: ServiceDep) -> JSONResponse:
        return await service.health(request)

    @app.get("/device")
    async def device_name(client: ClientDep) -> dict[str, str]:  # the typed dependency
        return {"device": client.device}

    return app


def create_starlette_app(
    device: str | None = None, limits: Limits | None = None, compute: Compute = y2x1
) -> Starlette:
    """The same service on plain Starlette: the same handlers, routed by hand."""
    service = Service(device, limits or Limits(), compute)
    app = Starlette(
        routes=[Route("/y", service.post_y, methods=["POST"]), Route("/health", service.health)],
        lifespan=service.lifespan,
    )
    app.state.service = service
    return app


def _settings() -> tuple[str | None, Limits]:
    device = os.environ.get("GPU_SERVICE_DEVICE") or None
    max_bytes = int(os.environ.get("GPU_SERVICE_MAX_BYTES", Limits.max_bytes))
    return device, Limits(max_bytes=max_bytes)


app = create_app(*_settings())
"""``uvicorn --app-dir examples fastapi_service:app`` (configured by the environment)."""
starlette_app = create_starlette_app(*_settings())
"""``uvicorn --app-dir examples fastapi_service:starlette_app``."""
