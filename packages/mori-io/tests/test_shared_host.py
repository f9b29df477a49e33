# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""allocate_shared_host_memory returns one type, SharedHostBuffer, whether or not numpy
imports; numpy, torch and memoryview view it without a copy, slices view the same
memory, and the mapping lives as long as any view of it."""

import gc
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import mori.core as mc
from mori.io import BackendType, SharedHostBuffer, StatusCode, allocate_shared_host_memory

# Runs in a fresh interpreter with numpy's import blocked; prints what it got.
NO_NUMPY = textwrap.dedent(
    """
    import sys

    class BlockNumpy:
        def find_spec(self, name, path=None, target=None):
            if name == "numpy" or name.startswith("numpy."):
                raise ImportError(f"{name} blocked by the test")

    sys.meta_path.insert(0, BlockNumpy())
    try:
        import numpy  # noqa: F401
    except ImportError:
        print("numpy blocked")
    from mori.io import allocate_shared_host_memory

    buf = allocate_shared_host_memory(64)
    buf[:] = bytes(range(64))
    buf[8:12] = b"mori"
    view = memoryview(buf)
    print(type(buf).__module__, type(buf).__qualname__, len(buf), buf.nbytes, view.format,
          view.readonly, bytes(buf[8:12]), "numpy" in sys.modules)
    """
)


def test_the_same_type_with_and_without_numpy():
    out = subprocess.run(
        [sys.executable, "-c", NO_NUMPY], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "numpy blocked"  # the subprocess really had no numpy
    buf = allocate_shared_host_memory(64)
    assert "numpy" in sys.modules  # and this process has it
    cls = type(buf)
    assert cls is SharedHostBuffer
    assert lines[1] == f"{cls.__module__} {cls.__qualname__} 64 64 B False b'mori' False"


def test_numpy_torch_and_memoryview_are_zero_copy_views():
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = np.random.default_rng(seed)
    n = 4096 + 3
    buf = allocate_shared_host_memory(n)
    assert len(buf) == buf.nbytes == buf.size == n and bytes(buf) == bytes(n)  # zeroed
    data = rng.integers(0, 256, n, dtype=np.uint8)
    buf[:] = data.tobytes()
    arr = np.asarray(buf)
    assert arr.dtype == np.uint8 and arr.shape == (n,) and arr.ctypes.data == buf.address
    assert np.array_equal(arr, data)
    assert np.frombuffer(buf, np.uint8).ctypes.data == buf.address
    arr[7] = 200  # numpy -> buffer
    assert buf[7] == 200
    buf[9] = 17  # buffer -> numpy
    assert arr[9] == 17

    torch = pytest.importorskip("torch")
    t = torch.frombuffer(buf, dtype=torch.uint8)
    assert t.data_ptr() == buf.address and t.numel() == n
    t[11] = 99
    assert buf[11] == 99 and arr[11] == 99
    assert torch.asarray(buf, dtype=torch.uint8).data_ptr() == buf.address

    view = memoryview(buf)
    view[13] = 42
    assert arr[13] == 42 and not view.readonly and view.format == "B"

    # A slice is a SharedHostBuffer over the same bytes; assigning to one writes them.
    part = buf[100:356]
    assert type(part) is SharedHostBuffer
    assert part.address == buf.address + 100 and len(part) == 256 and part.offset == 100
    part[:] = bytes(range(256))
    assert bytes(arr[100:356]) == bytes(range(256))
    assert part[-1] == 255 and buf[355] == 255
    buf[0:4] = np.array([1, 2, 3, 4], np.uint8)  # any contiguous buffer of that length
    assert bytes(buf[:4]) == b"\x01\x02\x03\x04"
    buf.fill(0xAB)
    assert not np.any(arr != 0xAB) and t[5].item() == 0xAB

    # The memory stays mapped while any view lives.
    addr = buf.address
    del buf, part, view
    gc.collect()
    arr[0] = 1
    t[1] = 2
    assert arr[:2].tolist() == [1, 2] and arr.ctypes.data == addr


def test_misuse_is_refused_with_the_values():
    buf = allocate_shared_host_memory(8)
    with pytest.raises(mc.InvalidArgumentError, match="slice of 2 bytes assigned 3 bytes"):
        buf[0:2] = b"abc"
    with pytest.raises(mc.InvalidArgumentError, match="step 2"):
        buf[::2]
    with pytest.raises(IndexError, match="index 8 out of range for 8 bytes"):
        buf[8]
    with pytest.raises(mc.InvalidArgumentError, match=r"= 256: a byte is in \[0, 255\]"):
        buf[0] = 256
    with pytest.raises(mc.InvalidArgumentError, match="size 0"):
        allocate_shared_host_memory(0)


def test_a_slice_registers_as_memory_inside_the_shared_block(engine_pair):
    a, b = engine_pair(BackendType.TCP, BackendType.SHM)
    block = allocate_shared_host_memory(1 << 16)
    region = block[5 : 5 + 4096]
    mb = b.register_array(region)
    assert (mb.data, mb.size) == (block.address + 5, 4096)
    local = np.arange(4096, dtype=np.uint32).astype(np.uint8)
    ma = a.register_array(local)
    st = a.write(ma, 0, mb, 0, 4096, a.allocate_transfer_uid())
    assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    assert a._engine.shm_mapping_state("b", mb.id) == 1  # mapped: the block is shared memory
    assert bytes(region) == local.tobytes()
