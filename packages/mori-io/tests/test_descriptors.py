# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""EngineDesc / MemoryDesc: msgpack round trip, and clear errors for anything else."""

import dataclasses

import msgpack
import pytest

import mori.core as mc
from mori.io import EngineDesc, MemoryDesc, MemoryLocationType
from mori.io.descriptors import FORMAT_VERSION


def test_round_trip_is_exact_and_compact():
    e = EngineDesc("prefill-0", "10.0.0.1", 40123, "node1", 4242, ("TCP",))
    m = MemoryDesc("prefill-0", 7, -1, 0x7F00DEADB000, 1 << 30, MemoryLocationType.CPU)
    assert EngineDesc.unpack(e.pack()) == e
    assert MemoryDesc.unpack(m.pack()) == m
    assert len(m.pack()) < 64 and len(e.pack()) < 80
    assert MemoryDesc.unpack(bytearray(m.pack())).loc == MemoryLocationType.CPU


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00\x01garbage\xff", b"\xc1", msgpack.packb({"a": 1}), msgpack.packb([1, 2, 3])],
)
def test_garbage_is_refused(data):
    with pytest.raises(mc.InvalidArgumentError, match="not a packed"):
        MemoryDesc.unpack(data)
    with pytest.raises(mc.InvalidArgumentError, match="not a packed"):
        EngineDesc.unpack(data)


def test_wrong_kind_version_and_types_are_refused():
    m = MemoryDesc("a", 1, -1, 4096, 10, MemoryLocationType.CPU)
    e = EngineDesc("a", "127.0.0.1", 1234)
    with pytest.raises(mc.InvalidArgumentError, match="not a packed EngineDesc"):
        EngineDesc.unpack(m.pack())
    obj = msgpack.unpackb(m.pack())
    obj[1] = FORMAT_VERSION + 1
    with pytest.raises(mc.InvalidArgumentError, match=f"format version {FORMAT_VERSION + 1}"):
        MemoryDesc.unpack(msgpack.packb(obj))
    obj = msgpack.unpackb(m.pack())
    obj[3] = "7"  # id as a string
    with pytest.raises(mc.InvalidArgumentError, match="field id is str"):
        MemoryDesc.unpack(msgpack.packb(obj))
    obj = msgpack.unpackb(e.pack())
    obj[4] = 70000
    with pytest.raises(mc.InvalidArgumentError, match="port 70000"):
        EngineDesc.unpack(msgpack.packb(obj))
    with pytest.raises(mc.InvalidArgumentError, match="expects bytes"):
        EngineDesc.unpack("text")
    with pytest.raises(mc.InvalidArgumentError, match="limit"):
        EngineDesc.unpack(b"\x00" * (1 << 17))
    assert dataclasses.replace(m, size=11).size == 11


def test_engine_desc_carries_a_random_secret_kept_out_of_repr():
    from mori.io import IOEngine
    from mori.io.descriptors import ENGINE_DESC_VERSION

    a, b = IOEngine("a"), IOEngine("b")
    da = a.get_engine_desc()
    assert len(da.secret) == 16 and da.secret not in (bytes(16), b.get_engine_desc().secret)
    assert EngineDesc.unpack(da.pack()) == da
    assert da.secret.hex() not in repr(da) and str(da.secret) not in repr(da)
    obj = msgpack.unpackb(da.pack())
    obj[-1] = da.secret[:8]  # a secret of the wrong width
    with pytest.raises(mc.InvalidArgumentError, match="secret of 8 bytes"):
        EngineDesc.unpack(msgpack.packb(obj))
    obj = msgpack.unpackb(da.pack())[:-1]  # the format before secrets
    obj[1] = ENGINE_DESC_VERSION - 1
    with pytest.raises(mc.InvalidArgumentError, match="older mori-io"):
        EngineDesc.unpack(msgpack.packb(obj))
    a.close()
    b.close()
