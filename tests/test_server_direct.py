"""A server is plain synchronous code, usable without an event loop (as cubecl's)."""

from __future__ import annotations

import numpy as np

import asynccube as ac

from .kernels import ADD, add_bindings


def test_host_server_without_a_loop() -> None:
    server = ac.HostServer(max_streams=2)
    stream = ac.StreamId(1)
    a, out = server.allocate(
        [ac.AllocationDescriptor.contiguous((8,), 4), ac.AllocationDescriptor.optimized((3, 5), 4)],
        stream,
    )
    assert a.strides == (1,) and out.strides[1] == 1 and out.strides[0] >= 5
    data = np.arange(8, dtype=np.float32)
    server.write([(a.handle.copy_descriptor((8,), (1,), 4), data.tobytes())], stream)
    result = server.allocate([ac.AllocationDescriptor.contiguous((8,), 4)], stream)[0].handle
    server.execute(
        ADD,
        ac.CubeCount(1),
        add_bindings(a.handle, a.handle, result, 8),
        ac.ExecutionMode.CHECKED,
        stream,
    )
    done = server.read([result.copy_descriptor((8,), (1,), 4)], stream)
    server.end_batch()
    assert done.wait(10)
    np.testing.assert_array_equal(np.frombuffer(done.result()[0], np.float32), 2 * data)
    assert server.memory_usage(stream).number_allocs == 3
    closed = server.close()
    assert closed.wait(10) and closed.result() is None
