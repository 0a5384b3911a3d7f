"""Several clients on one loop: each server's device is made current for its own
commands (the channel calls ``server.activate()``), also after a command waited for a
worker-thread job while other clients ran theirs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

import asynccube as ac
from asynccube._core.values.bindings import Bindings, CubeCount
from asynccube._core.values.kernel import Kernel
from asynccube._core.values.stream_id import StreamId
from asynccube._core.values.types import ExecutionMode

from .kernels import SCALE, blocks

pytestmark = pytest.mark.asyncio

_current: list[object] = [None]


class DeviceServer(ac.HostServer):
    """A host server standing for a device whose context must be current: its commands
    fail unless ``activate`` made it current; its kernels need a slow "compile" job."""

    def __init__(self) -> None:
        super().__init__()
        self.activations = 0
        self.compiled: set[str] = set()

    def activate(self) -> None:
        if _current[0] is not self:
            _current[0] = self
            self.activations += 1

    def _check(self) -> None:
        if _current[0] is not self:
            raise ac.DeviceError("a command ran while another client's device was current")

    def prepare(
        self, kernel: Kernel, count: CubeCount | None = None, stream: StreamId | None = None
    ) -> Callable[[], None] | None:
        if kernel.id in self.compiled:
            return None
        self.compiled.add(kernel.id)
        return lambda: time.sleep(0.02)

    def execute(
        self,
        kernel: Kernel,
        count: CubeCount,
        bindings: Bindings,
        mode: ExecutionMode,
        stream: StreamId,
    ) -> None:
        self._check()
        super().execute(kernel, count, bindings, mode, stream)

    def read(self, descriptors: Sequence[Any], stream: StreamId) -> Any:
        self._check()
        return super().read(descriptors, stream)

    def end_batch(self) -> None:
        self._check()
        super().end_batch()


def scale(h: ac.Handle, factor: float, n: int) -> ac.Bindings:
    """Bindings for SCALE over n float32."""
    b = ac.Bindings().with_buffer(h.binding()).with_scalar(np.float32, [factor])
    return b.with_scalar(np.uint32, [n])


async def test_each_client_activates_its_device_for_its_commands() -> None:
    loop = asyncio.get_running_loop()
    servers = [DeviceServer(), DeviceServer()]
    clients = [ac.ComputeClient(s, loop) for s in servers]
    try:
        n = 64
        hs = [c.create(np.ones(n, np.float32)) for c in clients]

        async def work(i: int) -> np.ndarray:
            c, h = clients[i], hs[i]
            for _ in range(5):
                c.execute(SCALE, blocks(n), scale(h, 2.0, n))  # the first waits for a job
                await asyncio.sleep(0)
            return await c.read_array(h, np.float32)

        out = await asyncio.gather(work(0), work(1))
        for arr in out:
            np.testing.assert_array_equal(arr, np.full(n, 32.0))
        assert all(s.activations >= 2 for s in servers)  # they took turns
    finally:
        for c in clients:
            await c.close()
