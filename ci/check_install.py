# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Checks on an installed environment (run by `nox -s dist_check`).

io-only with-rdma|without-rdma [no-libibverbs]
         mori-core + mori-io installed alone: `import mori` then mori.io and
         mori.shmem resolve and work without importing torch; mori.ep, mori.ops
         and mori.ccl are absent, and mori.ops says which wheel to install; torch
         was not installed. RDMA: compiled in, so that only this machine can make
         it unavailable (no rdma-core: "libibverbs.so.1 cannot be loaded"), never
         the build (no-libibverbs: where libibverbs.so.1 cannot be loaded, the
         reason says that); without-rdma: the wheel says it was built without on
         request.
ep-cpu   mori-ep installed with mori-core (and torch): mori.ep and mori.ops import
         and an op configures on CPU.
linked   mori.io's extension needs libmori_core.so and, once imported, the
         process maps exactly one libmori_core.so: mori-core's.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path


def io_only(rdma: str, verbs: str = "") -> None:
    import mori

    assert Path(mori.__file__).parent.name == "mori", mori.__file__  # mori-core's __init__
    avail = mori.io.backend_availability()  # lazy: no `import mori.io`
    assert avail["TCP"][0], avail
    print("mori.io", mori.io.__version__, "backends:")
    for name, (ok, why) in avail.items():
        print(f"  {name:6} {'yes' if ok else 'no ':3}  {why}")
    print("mori.io._C.rdma_build:", mori.io._C.rdma_build)
    rdma_ok, rdma_why = avail["RDMA"]
    if rdma == "with-rdma":
        assert mori.io._C.rdma_build.startswith("mori-io RDMA backend: compiled in"), (
            mori.io._C.rdma_build
        )
        assert rdma_ok or "built without" not in rdma_why, rdma_why
        if verbs == "no-libibverbs":  # as on a machine without rdma-core
            assert not rdma_ok and rdma_why.startswith("libibverbs.so.1 cannot be loaded"), rdma_why
    else:
        assert "MORI_IO_RDMA=off" in mori.io._C.rdma_build, mori.io._C.rdma_build
        assert (rdma_ok, rdma_why) == (False, mori.io._C.rdma_build), avail["RDMA"]
    assert mori.io.IOEngine is importlib.import_module("mori.io").IOEngine
    uid = mori.shmem.shmem_get_unique_id()
    assert len(uid) == 128, len(uid)
    print("mori.shmem: unique id of", len(uid), "bytes")
    assert "torch" not in sys.modules, "import mori / mori.io / mori.shmem imported torch"
    for missing in ("mori.ep", "mori.ops", "mori.ccl"):
        try:
            importlib.import_module(missing)
        except ModuleNotFoundError as e:
            print(f"{missing}: ModuleNotFoundError ({e})")
        else:
            raise AssertionError(f"{missing} imported but was not installed")
    try:
        _ = mori.ops
    except ModuleNotFoundError as e:
        assert "pip install mori-ep" in str(e), str(e)
        print(f"mori.ops: {e}")
    else:
        raise AssertionError("mori.ops resolved but mori-ep was not installed")
    assert importlib.util.find_spec("torch") is None, "torch was installed by mori-core/mori-io"
    print("torch: not installed")


def ep_cpu() -> None:
    import os

    import torch

    import mori
    import mori.ep
    import mori.ops
    from mori.core import shmem

    assert mori.ops.EpDispatchCombineOp is mori.ep.EpDispatchCombineOp
    # One process: a group of one on a host heap, a dispatch and a combine.
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
    shmem.init(device="cpu", heap_size="64M", timeout_s=30)
    cfg = mori.ep.EpDispatchCombineConfig(
        torch.bfloat16, rank=0, world_size=1, hidden_dim=64, scale_dim=0, scale_type_size=4,
        max_token_type_size=2, max_num_inp_token_per_rank=8, num_experts_per_rank=2,
        num_experts_per_token=1,
    )  # fmt: skip
    op = mori.ep.EpDispatchCombineOp(cfg)
    x = torch.randn(4, 64).to(torch.bfloat16)
    indices = torch.tensor([[0], [1], [1], [0]], dtype=torch.int32)
    out, out_w, _, _, received = op.dispatch(x, torch.ones(4, 1), None, indices)
    y, _ = op.combine(out, out_w, indices)
    assert int(received[0]) == 4 and torch.equal(y[:4], x), (received, y[:4], x)
    print(
        f"mori.ep {mori.ep.__version__} (mori.core {mori.core.__version__}, torch "
        f"{torch.__version__}): CPU dispatch + combine of 4 tokens on a host heap: exact"
    )
    shmem.finalize(force=True)


def linked() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from check_dist import dynamic_tags

    import mori.core
    import mori.io._C as ext

    needed, _ = dynamic_tags(Path(ext.__file__).read_bytes())
    assert "libmori_core.so" in needed, needed
    io_dir = Path(ext.__file__).parent
    copies = list(io_dir.rglob("libmori_core*"))
    assert not copies, f"mori-io carries a copy of libmori_core: {copies}"
    maps = {
        line.split()[-1]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if line.rstrip().endswith("libmori_core.so")
    }
    expected = str(Path(mori.core.library_path()).resolve())
    assert maps == {expected}, f"mapped {maps}, expected only {expected}"
    print(f"{ext.__file__}\n  NEEDED {needed}\n  libmori_core mapped from {expected}")


if __name__ == "__main__":
    {"io-only": io_only, "ep-cpu": ep_cpu, "linked": linked}[sys.argv[1]](*sys.argv[2:])
