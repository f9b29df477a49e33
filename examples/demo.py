# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori demo (`nox -s demo`): what this machine has, a bootstrap round among two
local processes, and one real call into each package's native extension.

Runs on any Linux machine; uses GPUs where present."""

from __future__ import annotations

import os
import sys

WORKER_FLAG = "--bootstrap-worker"
MOE_FLAG = "--moe-worker"


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


def moe_worker() -> None:
    """One rank of the MoE scene: route tokens with a random gate, dispatch them, let
    each rank's experts scale their rows, combine, check against a local reference."""
    import json
    import time

    import torch

    import mori.core as mc
    import mori.ep
    from mori.core import shmem
    from mori.core.bootstrap import TcpBootstrap
    from mori.ep import EpDispatchCombineConfig, EpDispatchCombineOp

    b = TcpBootstrap.from_env()
    rank, world = b.rank, b.world_size
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cuda = gpus >= world and mc.build_info().get("with_cuda") and mori.ep._C.with_cuda
    if cuda:
        torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    shmem.init(device=rank if cuda else "cpu", heap_size="64M", bootstrap=b, timeout_s=30)
    tokens, hidden, epr, k = 64, 512, 8, 4
    cfg = EpDispatchCombineConfig(
        rank=rank,
        world_size=world,
        hidden_dim=hidden,
        scale_dim=0,
        scale_type_size=4,
        max_token_type_size=2,
        max_num_inp_token_per_rank=tokens,
        num_experts_per_rank=epr,
        num_experts_per_token=k,
        block_num=8,
        warp_num_per_block=8,
    )
    op = EpDispatchCombineOp(cfg, timeout_s=30)
    # Expert e multiplies its input by expert_scale[e]; every rank knows all scales.
    expert_scale = torch.linspace(0.5, 2.0, cfg.num_experts, device=dev)
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16).to(dev)
    gate = torch.randn(tokens, cfg.num_experts, generator=gen).softmax(dim=1)
    w, idx = gate.topk(k, dim=1)
    w, idx = w.to(dev), idx.to(torch.int32).to(dev)

    def step():
        out, out_w, _, out_idx, total_t = op.dispatch(x, w, None, idx)
        n = int(total_t.item())
        mine = (out_idx[:n] // epr) == rank  # the slots whose expert lives here
        coef = (out_w[:n] * expert_scale[out_idx[:n].clamp(min=0).long()] * mine).sum(1)
        y = (out[:n].float() * coef[:, None]).to(torch.bfloat16)  # this rank's experts
        combined, _ = op.combine(y, out_w[:n], out_idx[:n])
        return n, combined

    step()  # warm-up: first touches of the buffers
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    received, combined = step()
    if cuda:
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    ref = x.float() * (w * expert_scale[idx.long()]).sum(1, keepdim=True)
    err = float((combined.float() - ref).abs().max() / ref.abs().max())
    sent = [int(((idx // epr) == d).any(1).sum()) for d in range(world)]
    stats = {"rank": rank, "sent": sent, "recv": received, "ms": ms, "err": err, "dev": str(dev)}
    rows = [json.loads(blob) for blob in b.all_gather(json.dumps(stats).encode())]
    if rank == 0:
        from tabulate import tabulate

        row_kb = hidden * 2 / 1024
        print(
            tabulate(
                [
                    (
                        r["rank"],
                        r["dev"],
                        tokens,
                        " / ".join(map(str, r["sent"])),
                        r["recv"],
                        f"{r['recv'] * row_kb:.0f}",
                        f"{r['ms']:.2f}",
                        f"{r['err']:.1e}",
                    )
                    for r in rows
                ],
                headers=[
                    "rank",
                    "device",
                    "tokens",
                    "rows sent to 0 / 1",
                    "rows received",
                    "KiB received",
                    "dispatch+combine ms",
                    "max rel err",
                ],
            )
        )
    ok = err < 2e-2
    b.barrier()
    op.close()  # drops the op's symmetric block before finalize
    shmem.finalize()
    if not ok:
        raise SystemExit(f"rank {rank}: combine differs from the local reference ({err:.3g})")


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

    print(
        "\n== bootstrap round + symmetric heap among 2 local processes (native TCP, torchrun env)"
    )
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

    print("\n== mori.ep: an MoE layer on 2 local processes (random top-4 gate, 16 experts;")
    print("   expert e scales its rows by s_e; combine must give sum_k w_k s_e x)")
    for r in launch_local([__file__, MOE_FLAG], 2, timeout_s=60):
        if r.output.strip():
            print(r.output.rstrip())

    print("\n== mori.ccl: host reduction (bf16 in, fp32 accumulate, one rounding)")
    xs = [torch.full((4,), v, dtype=torch.bfloat16) for v in (1.0, 2.0**-8, 2.0**-8)]
    out = mori.ccl.reduce_sum(torch.empty(4, dtype=torch.bfloat16), xs)
    naive = (xs[0] + xs[1]) + xs[2]
    print(f"    1 + 2^-8 + 2^-8: mori {out[0].item()} (bf16 pairwise in torch: {naive[0].item()})")
    print("\ndemo finished")


if __name__ == "__main__":
    if WORKER_FLAG in sys.argv:
        bootstrap_worker()
    elif MOE_FLAG in sys.argv:
        moe_worker()
    else:
        main()
