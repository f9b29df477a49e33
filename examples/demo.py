# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori demo (`nox -s demo`): what this machine has, a bootstrap round among two
local processes, and one real call into each package's native extension.

Runs on any Linux machine; uses GPUs where present."""

from __future__ import annotations

import os
import sys

WORKER_FLAG = "--bootstrap-worker"


def bootstrap_worker() -> None:
    from mori.core.bootstrap import TcpBootstrap

    b = TcpBootstrap.from_env()
    hello = f"hello from rank {b.rank} (pid {os.getpid()})".encode()
    gathered = b.all_gather(hello)
    token = b.broadcast(os.urandom(8) if b.rank == 0 else None, root=0)
    b.barrier()
    if b.rank == 0:
        for blob in gathered:
            print("   ", blob.decode())
    print(f"    rank {b.rank} got root's token {token.hex()}")

    # The same bootstrap brings up a symmetric heap in host memory: each pe puts
    # its rank into its right neighbour's copy and raises a flag there.
    import torch

    from mori.core import shmem

    shmem.init(device="cpu", heap_size="8M", bootstrap=b)
    me, n = shmem.my_pe(), shmem.n_pes()
    data = shmem.empty((4,), torch.int64)
    flag = shmem.empty((1,), torch.int64)
    flag.zero_()
    shmem.barrier_all()
    shmem.put(data, torch.full((4,), 100 + me), (me + 1) % n)
    shmem.signal(flag, 1, (me + 1) % n)
    shmem.wait_until(flag, "eq", 1, timeout_s=30)
    print(f"    pe {me}: symmetric buffer received {data.tolist()} from pe {(me - 1) % n}")
    shmem.barrier_all()
    del data, flag
    shmem.finalize()


def main() -> None:
    import torch
    from tabulate import tabulate

    import mori.ccl
    import mori.core
    import mori.ep
    import mori.io
    from mori.core.launch import launch_local
    from mori.core.topology import format_table, get_topology

    print("== mori packages")
    info = mori.core.build_info()
    rows = [
        ("mori-core", mori.core.__version__, mori.core.library_path()),
        ("mori-io", mori.io.__version__, mori.io._C.__file__),
        ("mori-ep", mori.ep.__version__, mori.ep._C.__file__),
        ("mori-ccl", mori.ccl.__version__, mori.ccl._C.__file__),
    ]
    print(tabulate(rows, headers=["package", "version", "native module"]))
    print(
        f"CUDA build: {info['with_cuda']} (archs {info['cuda_archs'] or '-'}), "
        f"devices: {info['cuda_device_count']}"
    )

    print("\n== topology")
    print(format_table(get_topology()))

    print("\n== bootstrap round + symmetric heap among 2 local processes (native TCP, torchrun env)")
    for r in launch_local([__file__, WORKER_FLAG], 2, timeout_s=60):
        print(r.output.rstrip())

    print("\n== mori.io: transfer backends on this machine")
    rows = [
        (k, "yes" if ok else "no", why) for k, (ok, why) in mori.io.backend_availability().items()
    ]
    print(tabulate(rows, headers=["backend", "available", "why"]))

    print("\n== mori.ep: routing layout of 8 tokens, top-2 of 8 experts on 4 ranks")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    idx = torch.rand(8, 8, generator=gen).topk(2, dim=1).indices.to(torch.int32)
    tpr, tpe, _ = mori.ep.get_dispatch_layout(idx.to(dev), num_experts=8, world_size=4)
    print(f"    device {dev}: tokens per rank {tpr.tolist()}, tokens per expert {tpe.tolist()}")
    try:
        mori.ep.get_dispatch_layout(torch.tensor([[3, 99]], dtype=torch.int32), 8, 4)
    except mori.core.InvalidArgumentError as e:
        print(f"    bad input is refused: {type(e).__name__}: {e}")

    print("\n== mori.ccl: host reduction (bf16 in, fp32 accumulate, one rounding)")
    xs = [torch.full((4,), v, dtype=torch.bfloat16) for v in (1.0, 2.0**-8, 2.0**-8)]
    out = mori.ccl.reduce_sum(torch.empty(4, dtype=torch.bfloat16), xs)
    naive = (xs[0] + xs[1]) + xs[2]
    print(f"    1 + 2^-8 + 2^-8: mori {out[0].item()} (bf16 pairwise in torch: {naive[0].item()})")
    print("\ndemo finished")


if __name__ == "__main__":
    if WORKER_FLAG in sys.argv:
        bootstrap_worker()
    else:
        main()
