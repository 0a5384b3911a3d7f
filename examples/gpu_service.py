"""A GPU web service on asynccube and aiohttp: float32 values in, ``2x + 1`` out.

    python examples/gpu_service.py                       # cuda:0 where usable, else the host
    python examples/gpu_service.py --device host --port 8080 --max-bytes 1048576

    curl -s http://127.0.0.1:8080/health
    python -c "import numpy as np; np.arange(4, dtype=np.float32).tofile('x.f32')"
    curl -s --data-binary @x.f32 -H 'Content-Type: application/octet-stream' \\
        http://127.0.0.1:8080/y | python -c "import numpy as np, sys; \\
        print(np.frombuffer(sys.stdin.buffer.read(), np.float32))"   # [1. 3. 5. 7.]

``POST /y`` takes a body of float32 values (``Content-Type: application/octet-stream``)
and answers ``2x + 1`` in the same form, computed by one kernel that has a CUDA part (on
a GPU) and a host part (on the host server, where no GPU is usable). ``GET /health``
answers JSON: the device, the requests served, refused (by status), cancelled and in
flight.

Bad input is answered with a status and one line of JSON, ``{"error": "..."}``, naming
the problem, and the service goes on serving the others:

* 415: the content type is not ``application/octet-stream``;
* 400: the body is empty or its length is not a multiple of 4 (float32);
* 413: the body is over ``--max-bytes`` (told by its Content-Length before anything is
  read, or counted while a chunked body arrives);
* 408: the body did not arrive within ``--body-timeout`` seconds (a client that sends
  half a body and stalls); the connection closes.

On SIGTERM (or Ctrl-C) the client is closed with ``close(cancel_pending=True,
abandon_after=5.0)``: work not yet issued to the device is dropped, the rest is waited
for at most 5 s.

A client that disconnects while its request runs has its handler cancelled
(``handler_cancellation=True``): the awaited ``client.read`` is cancelled, and the
request's buffers return to the pool once the device is done with them (asynccube's
cancellation rules), so nothing leaks. Each request is its own task: waiting for a body
or for the device never blocks the loop.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiohttp import StreamReader, web

import asynccube as ac

CONTENT_TYPE = "application/octet-stream"
ELEMENT = 4
"""Bytes per value (float32)."""
BLOCK = 256
"""Threads per cube of the CUDA kernel."""

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
    "example_service_y2x1", cuda=ac.CudaSource(Y2X1_SRC, "y2x1", (BLOCK, 1, 1)), host=_y2x1_host
)
Compute = Callable[[ac.ComputeClient, bytes], Awaitable[bytes]]
"""What a request computes: the client and the body's bytes in, the answer's bytes out."""


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
    """A request answered with an error ``status`` and a one-line JSON ``message``;
    ``close``: the connection closes after the answer."""

    def __init__(self, status: int, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status, self.message, self.close = status, message, close

    def response(self) -> web.Response:
        """The answer: ``{"error": message}`` with the status."""
        response = web.json_response({"error": self.message}, status=self.status)
        if self.close:
            response.force_close()
        return response


def _check_length(size: int, limits: Limits) -> None:
    if size > limits.max_bytes:
        raise Refused(413, f"the body has {size} bytes, over the limit of {limits.max_bytes}")
    if size == 0:
        raise Refused(400, "the body is empty: send float32 values")
    if size % ELEMENT:
        raise Refused(400, f"the body has {size} bytes, not a multiple of {ELEMENT} (float32)")


async def _read_at_most(stream: StreamReader, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in stream.iter_any():
        size += len(chunk)
        if size > limit:
            raise Refused(413, f"the body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_body(request: web.Request, limits: Limits) -> bytes:
    """The request's body, checked; raises :class:`Refused` saying what is wrong."""
    if request.content_type != CONTENT_TYPE:
        raise Refused(415, f"Content-Type must be {CONTENT_TYPE}, got {request.content_type!r}")
    if request.content_length is not None:  # refused before a byte of the body is read
        _check_length(request.content_length, limits)
    try:
        async with asyncio.timeout(limits.body_timeout):
            body = await _read_at_most(request.content, limits.max_bytes)
    except TimeoutError:
        message = f"the body did not arrive within {limits.body_timeout:g} s"
        raise Refused(408, message, close=True) from None
    _check_length(len(body), limits)
    return body


@dataclass
class Counts:
    """The requests served, refused (per status), cancelled and in flight."""

    served: int = 0
    cancelled: int = 0
    in_flight: int = 0
    refused: dict[int, int] = field(default_factory=dict)


class Service:
    """The service's state: its client (open while the app runs), limits and counts."""

    def __init__(self, device: str | None, limits: Limits, compute: Compute) -> None:
        self.device, self.limits, self.compute = device, limits, compute
        self.counts = Counts()
        self._client: ac.ComputeClient | None = None

    @property
    def client(self) -> ac.ComputeClient:
        """The client, while the app runs."""
        if self._client is None:
            raise RuntimeError("the service is not running")
        return self._client

    async def client_context(self, app: web.Application) -> AsyncIterator[None]:
        """Opens the client (and compiles the kernel) before the first request; closes
        it when the app stops (Ctrl-C, SIGTERM), dropping the work not yet issued to the
        device and waiting at most ``shutdown_after`` seconds for the rest."""
        client = await ac.connect(self.device)
        try:
            await self.compute(client, bytes(ELEMENT))
            self._client = client
            yield
        finally:
            self._client = None
            await client.close(cancel_pending=True, abandon_after=self.limits.shutdown_after)

    async def post_y(self, request: web.Request) -> web.Response:
        """``POST /y``: float32 values in, the computed values out."""
        counts = self.counts
        counts.in_flight += 1
        try:
            out = await self.compute(self.client, await read_body(request, self.limits))
        except Refused as refused:
            counts.refused[refused.status] = counts.refused.get(refused.status, 0) + 1
            return refused.response()
        except asyncio.CancelledError:  # the client went away: its awaited read is cancelled
            counts.cancelled += 1
            raise
        finally:
            counts.in_flight -= 1
        counts.served += 1
        return web.Response(body=out, content_type=CONTENT_TYPE)

    async def health(self, request: web.Request) -> web.Response:
        """``GET /health``: the device and the counts."""
        c = self.counts
        return web.json_response({"status": "ok", "device": self.client.device,
                                  "served": c.served, "refused": c.refused,
                                  "cancelled": c.cancelled, "in_flight": c.in_flight})  # fmt: skip


SERVICE = web.AppKey("service", Service)


def create_app(
    device: str | None = None, limits: Limits | None = None, compute: Compute = y2x1
) -> web.Application:
    """The application: ``POST /y`` and ``GET /health`` on a client of ``device``
    (``None``: cuda:0 where usable, else the host server). Serve it with
    :func:`runner_options`."""
    service = Service(device, limits or Limits(), compute)
    app = web.Application(client_max_size=service.limits.max_bytes)
    app[SERVICE] = service
    app.cleanup_ctx.append(service.client_context)
    app.router.add_post("/y", service.post_y)
    app.router.add_get("/health", service.health)
    return app


def runner_options(limits: Limits) -> dict[str, Any]:
    """aiohttp's server settings for the service: a client that disconnects cancels its
    handler, and a body left unread after an answer is drained for at most
    ``limits.body_timeout`` seconds before the connection closes."""
    return {"handler_cancellation": True, "lingering_time": limits.body_timeout}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module's docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--device", default=None, help="host, cuda:0, ... (default: cuda:0 if usable)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--max-bytes", type=int, default=Limits.max_bytes)
    p.add_argument("--body-timeout", type=float, default=Limits.body_timeout)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Serve until interrupted (Ctrl-C)."""
    args = parse_args(argv)
    limits = Limits(args.max_bytes, args.body_timeout)
    app = create_app(args.device, limits)
    web.run_app(app, host=args.host, port=args.port, **runner_options(limits))


if __name__ == "__main__":
    main()
