"""The kernel argument ABI: parameter order and the bytes each kernelParams entry points at."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from asynccube._core.cuda.abi import TENSOR_MAP_BYTES, ArgPack, ArgPacker, Signature
from asynccube._core.errors import InvalidArgument
from asynccube._core.memory.slice import ReleaseQueue, SliceHandle
from asynccube._core.values.bindings import Bindings, MetadataBinding, ScalarBinding
from asynccube._core.values.stream_id import StreamId
from asynccube._core.values.types import Handle


def handles(n: int) -> list[Handle]:
    q = ReleaseQueue(-7)
    return [Handle(SliceHandle(i, q), None, None, StreamId(0), 0, 64) for i in range(n)]


def pointed(pack: ArgPack, index: int, size: int) -> bytes:
    """The bytes kernelParams[index] points at, read through the raw address."""
    params = (ctypes.c_uint64 * len(pack.params)).from_address(pack.address)
    return ctypes.string_at(params[index], size)


def full_bindings() -> tuple[Bindings, list[Handle]]:
    hs = handles(2)
    b = (
        Bindings()
        .with_buffers([h.binding() for h in hs])
        .with_scalar(np.uint8, [200, 7])
        .with_scalar(np.float32, [1.5])
        .with_scalar(np.int64, [-(2**40)])
        .with_scalar(np.float16, [0.5])
        .with_metadata(MetadataBinding([11, 22, 33]))
    )
    return b, hs


def test_parameter_order_and_bytes() -> None:
    b, _ = full_bindings()
    packer = ArgPacker()
    tmap = bytes(range(128))
    address = packer.pack(b, [0x1000, 0xDEAD_BEEF_0000], [tmap] * 0)
    pack, _ = packer.get(b)
    sig = pack.signature
    assert sig.param_sizes() == [8, 8, 4, 2, 8, 1, 1, 12]
    assert address == pack.address
    want = [
        (0x1000).to_bytes(8, "little"),
        (0xDEAD_BEEF_0000).to_bytes(8, "little"),
        np.float32(1.5).tobytes(),
        np.float16(0.5).tobytes(),
        np.int64(-(2**40)).tobytes(),
        bytes([200]),
        bytes([7]),
        np.array([11, 22, 33], np.uint32).tobytes(),
    ]
    assert [pointed(pack, i, len(w)) for i, w in enumerate(want)] == want


def test_tensor_maps_come_after_buffers_and_are_64_aligned() -> None:
    sig = Signature(1, 2, [(np.int32, 1)])
    pack = ArgPack(sig)
    maps = [bytes([i]) * TENSOR_MAP_BYTES for i in (1, 2)]
    pack.pack([0xABC], [ScalarBinding(np.int32, [-5])], None, maps)
    assert pointed(pack, 0, 8) == (0xABC).to_bytes(8, "little")
    assert pointed(pack, 1, 128) == maps[0]
    assert pointed(pack, 2, 128) == maps[1]
    assert pointed(pack, 3, 4) == np.int32(-5).tobytes()
    params = np.frombuffer(ctypes.string_at(pack.address, 8 * 4), np.uint64)
    assert all(int(p) % 64 == 0 for p in params[1:3])


def test_pack_is_reused_and_only_values_change() -> None:
    b, _ = full_bindings()
    packer = ArgPacker()
    a1 = packer.pack(b, [1, 2])
    pack, _ = packer.get(b)
    params_before = ctypes.string_at(a1, 8 * len(pack.params))
    b.with_scalar(np.float32, [9.0])
    a2 = packer.pack(b, [3, 4])
    assert a1 == a2
    assert len(packer) == 1
    assert ctypes.string_at(a2, 8 * len(pack.params)) == params_before
    assert pointed(pack, 0, 8) == (3).to_bytes(8, "little")
    assert pointed(pack, 2, 4) == np.float32(9.0).tobytes()


def test_new_signature_gets_new_pack() -> None:
    packer = ArgPacker()
    hs = handles(3)
    packer.pack(Bindings().with_buffers([h.binding() for h in hs[:2]]), [1, 2])
    packer.pack(Bindings().with_buffers([h.binding() for h in hs]), [1, 2, 3])
    packer.pack(Bindings().with_buffers([hs[0].binding()]).with_scalar(np.int32, [1]), [1])
    packer.pack(Bindings().with_buffers([hs[0].binding()]).with_scalar(np.int32, [1, 2]), [1])
    assert len(packer) == 4


def test_no_parameters_at_all() -> None:
    pack = ArgPack(Signature(0))
    assert pack.pack([]) == pack.address


def test_scalars_must_be_in_abi_order() -> None:
    with pytest.raises(InvalidArgument):
        Signature(0, 0, [(np.int32, 1), (np.float32, 1)])
    with pytest.raises(InvalidArgument):
        Signature(0, 0, [(np.complex64, 1)])


def test_c_params_matches_signature() -> None:
    b, _ = full_bindings()
    text = Signature.of(b).c_params(["float", "int"])
    assert text == (
        "float* b0, int* b1, float float32_0, ac_f16 float16_0, long long int64_0, "
        "unsigned char uint8_0, unsigned char uint8_1, ac_metadata<3> meta"
    )


def test_tensor_map_count_must_match() -> None:
    b, _ = full_bindings()
    with pytest.raises(InvalidArgument, match="tensor map"):
        ArgPacker().pack(b, [1, 2], [bytes(128)])


def test_metadata_alone_is_written_where_its_parameter_points() -> None:
    pack = ArgPack(Signature(0, 0, [], 1))
    pack.pack([], [], np.array([0xDEADBEEF], np.uint32))
    assert pack.param_bytes(0, 4) == (0xDEADBEEF).to_bytes(4, "little")
