"""A read returns bytes if and only if their last writer succeeded (issue 28): random
interleavings of writes, failing commands and reads on several streams, against a numpy
oracle of the last successful writer; each device, both memory presets, asyncio and
trio (each example runs in its own event loop: hypothesis drives a plain function)."""

from __future__ import annotations

import anyio
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asynccube as ac

from .test_edges_errors import FAIL_1, FAILED, _on

_OPS = st.lists(
    st.tuples(st.sampled_from(["write", "fail", "read"]), st.integers(0, 2), st.integers(0, 2)),
    min_size=1,
    max_size=14,
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("pool", ["default", "exclusive"])
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=_OPS)
def test_a_read_returns_bytes_iff_their_last_writer_succeeded(
    device: str, pool: str, backend: str, ops: list[tuple[str, int, int]]
) -> None:
    anyio.run(_scenario, device, pool, ops, backend=backend)


async def _scenario(device: str, pool: str, ops: list[tuple[str, int, int]]) -> None:
    async with ac.open_client(device, config={"memory": {"pool": pool}}) as client:
        bufs = [client.create(np.full(4, -1, np.float32)) for _ in range(3)]
        last: list[float | None] = [-1.0] * 3  # None: the last writer failed
        held = [False] * 3  # an error held for the stream, not yet raised
        for step, (op, buf, stream) in enumerate(ops):
            with ac.StreamId.pinned(ac.StreamId(40 + stream)):
                await _step(client, bufs[buf], op, float(step), last, buf, held, stream)
        for stream in range(3):
            with ac.StreamId.pinned(ac.StreamId(40 + stream)):
                if held[stream]:
                    with pytest.raises(FAILED):
                        await client.sync()
                await client.sync()


async def _step(
    client: ac.ComputeClient,
    h: ac.Handle,
    op: str,
    value: float,
    last: list[float | None],
    buf: int,
    held: list[bool],
    stream: int,
) -> None:
    if op == "write":
        client.write([(h.copy_descriptor((4,), (1,), 4), np.full(4, value, np.float32).tobytes())])
        last[buf] = value
    elif op == "fail":
        client.execute(FAIL_1, ac.CubeCount(1), _on([h]))
        if last[buf] is not None:  # else skipped: its buffer carries a failure (issue 40)
            held[stream] = True
        last[buf] = None
    elif held[stream]:
        with pytest.raises(FAILED):  # the stream's own failure first, with the read
            await client.read_array(h, np.float32)
        held[stream] = False
    elif last[buf] is None:
        with pytest.raises(ac.TaintedBuffer):
            await client.read_array(h, np.float32)
    else:
        np.testing.assert_array_equal(await client.read_array(h, np.float32), last[buf])
