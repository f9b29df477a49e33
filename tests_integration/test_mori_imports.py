# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""ROCm/mori's import style across the wheels: `import mori`, then mori.io,
mori.shmem and mori.ops by attribute; mori-core + mori-io alone stay torch-free."""

import os
import subprocess
import sys
import textwrap

import pytest

import mori

# Prepended to the subprocess script: the named modules (and their submodules)
# cannot be imported, as if their wheels were not installed.
BLOCKER = textwrap.dedent(
    """
    import sys

    class _Blocker:
        def find_spec(self, fullname, path=None, target=None):
            if any(fullname == n or fullname.startswith(n + ".") for n in BLOCKED):
                raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
            return None

    sys.meta_path.insert(0, _Blocker())
    """
)


def test_mori_ops_is_mori_ep_under_rocm_mori_names():
    ep = pytest.importorskip("mori.ep")
    for name in ("EpDispatchCombineConfig", "EpDispatchCombineOp", "EpDispatchCombineKernelType"):
        assert getattr(mori.ops, name) is getattr(ep, name), name
    assert mori.ops.__all__ == ep.__all__
    for name in ep.__all__:
        assert getattr(mori.ops, name) is getattr(ep, name), name


def test_submodules_by_attribute_after_import_mori():
    import mori.core.shmem

    assert mori.io.IOEngine is sys.modules["mori.io"].IOEngine
    assert mori.shmem.shmem_malloc.__module__ == "mori.shmem.api"
    assert mori.core.shmem is sys.modules["mori.core.shmem"]


def test_core_and_io_alone_work_without_torch():
    code = textwrap.dedent(
        """
        import mori

        a = mori.io.IOEngine("prefill", mori.io.IOEngineConfig("127.0.0.1", 0))
        b = mori.io.IOEngine("decode", mori.io.IOEngineConfig("127.0.0.1", 0))
        for e in (a, b):
            e.create_backend(mori.io.BackendType.TCP, mori.io.TcpBackendConfig())
        a.register_remote_engine(b.get_engine_desc())
        b.register_remote_engine(a.get_engine_desc())
        n = 1 << 16
        src, dst = mori.io.allocate_shared_host_memory(n), mori.io.allocate_shared_host_memory(n)
        src[:] = bytes(i % 251 for i in range(n))
        st = a.write(a.register_array(src), 0, b.register_array(dst), 0, n, a.allocate_transfer_uid())
        st.Wait()
        assert st.Succeeded(), st.Message()
        assert bytes(memoryview(dst)) == bytes(memoryview(src))
        assert len(mori.shmem.shmem_get_unique_id()) == 128
        assert "torch" not in sys.modules, "mori / mori.io / mori.shmem imported torch"
        try:
            mori.ops
        except ModuleNotFoundError as e:
            assert "pip install mori-ep" in str(e), str(e)
        else:
            raise AssertionError("mori.ops resolved without mori-ep")
        print("io-only ok")
        """
    )
    blocked = ["torch", "numpy", "mori.ep", "mori.ops", "mori.ccl"]
    script = f"BLOCKED = {blocked!r}\n" + BLOCKER + code
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert proc.returncode == 0 and "io-only ok" in proc.stdout, proc.stdout + proc.stderr
