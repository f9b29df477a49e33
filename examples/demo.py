# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori demo (`nox -s demo`): what this machine has, a bootstrap round among two
local processes, KV-cache transfer between a prefill and a decode server, an MoE
layer over mori.ep, a balanced MoE layer (mori.ep.balanced) under a skewed router, a
tensor-parallel layer over mori.ccl, and one real call into each package's native
extension.

Runs on any Linux machine; uses GPUs where present."""

from __future__ import annotations

import os
import sys

WORKER_FLAG = "--bootstrap-worker"
MOE_FLAG = "--moe-worker"
KV_FLAG = "--kv-worker"
TP_FLAG = "--tp-worker"
BALANCED_FLAG = "--balanced-worker"

# The KV-cache scene: each server's paged cache is [layers, blocks, block bytes]; a
# block holds 16 tokens x 8 KV heads x 128 dims x bf16, K and V (64 KiB per layer).
KV_LAYERS, KV_BLOCKS, KV_BLOCK_BYTES = 8, 64, 64 << 10
KV_REQUESTS = (4, 9, 16, 5, 12, 7)  # blocks per request
KV_PULLED = 3  # decode pulls requests 0-2 (reads); prefill pushes the others (writes)


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
    local_rank = int(os.environ.get("LOCAL_RANK", rank))  # GPUs are numbered per host
    cuda = gpus >= world and mc.build_info().get("with_cuda") and mori.ep._C.with_cuda
    if cuda:
        torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    shmem.init(device=dev, heap_size="64M", bootstrap=b, timeout_s=30)
    tokens, hidden, epr, k = 64, 512, 8, 4
    cfg = EpDispatchCombineConfig(
        data_type=torch.bfloat16,
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
        combined, _ = op.combine(y, out_w[:n], idx)  # idx: this rank's own routing
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
    if cuda:
        torch.cuda.synchronize()  # no kernel may still touch the heap when it is freed
    b.barrier()
    op.close()  # drops the op's symmetric block before finalize
    shmem.finalize()
    if not ok:
        raise SystemExit(f"rank {rank}: combine differs from the local reference ({err:.3g})")


def tp_worker() -> None:
    """One rank of the tensor-parallel scene: a row-parallel linear layer. Rank r
    holds the r-th slice of the input features and of the weight's rows, computes a
    partial product, and mori.ccl's all-reduce sums the partials; the result is
    checked against the whole layer computed in one process, and the all-reduce is
    timed beside torch.distributed's (gloo on CPU, NCCL on GPUs) on the same data."""
    import json
    import statistics
    import time

    import torch
    import torch.distributed as dist

    import mori.ccl
    import mori.core as mc
    from mori.core import shmem

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    cuda = bool(gpus >= world and mc.build_info().get("with_cuda"))
    cuda = cuda and bool(getattr(mori.ccl._C, "with_cuda", False))
    if cuda:
        torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", init_method="env://")
    shmem.init(device=dev, heap_size="64M", timeout_s=30)
    tokens, features, out_features = 16, 4096, 1024
    comm = mori.ccl.Communicator(max_bytes=tokens * out_features * 4, timeout_s=30)

    # The whole layer, the same on every rank (one seed); rank r keeps its slice.
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(tokens, features, generator=gen).to(torch.bfloat16).float()
    w = torch.randn(features, out_features, generator=gen).to(torch.bfloat16).float()
    cols = slice(rank * features // world, (rank + 1) * features // world)
    xs, ws = x[:, cols].to(dev), w[cols].to(dev)
    partial = xs @ ws
    y = comm.all_reduce(partial.clone())

    # fp32 sums of n products differ from any other order by at most
    # n * 2^-24 / (1 - n * 2^-24) of the sum of magnitudes (Higham's gamma_n), for
    # the reference and for the sharded sum alike: allow twice that.
    ref = x @ w
    n = features
    bound = 2 * (n * 2.0**-24 / (1 - n * 2.0**-24)) * (x.abs() @ w.abs())
    err = (y.cpu() - ref).abs()
    ok = bool((err <= bound).all())

    def timed(fn, reps: int = 50) -> float:
        samples = []
        for _ in range(reps):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize()
            samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples)

    buf = partial.clone()
    timed(lambda: comm.all_reduce(buf), 5)  # warm-up
    mori_us = timed(lambda: comm.all_reduce(buf))
    base_us = timed(lambda: dist.all_reduce(buf))
    stats = {
        "rank": rank,
        "dev": str(dev),
        "err": float(err.max()),
        "ok": ok,
        "mori_us": mori_us,
        "base_us": base_us,
    }
    gathered = [None] * world
    dist.all_gather_object(gathered, json.dumps(stats))
    if rank == 0:
        from tabulate import tabulate

        rows = [json.loads(g) for g in gathered]
        kib = tokens * out_features * 4 / 1024
        print(
            tabulate(
                [
                    (
                        r["rank"],
                        r["dev"],
                        f"{r['err']:.1e}",
                        "yes" if r["ok"] else "NO",
                        f"{r['mori_us']:.1f}",
                        f"{r['base_us']:.1f}",
                    )
                    for r in rows
                ],
                headers=[
                    "rank",
                    "device",
                    "max |y - ref|",
                    "within fp32 bound",
                    f"mori.ccl all_reduce {kib:.0f} KiB us",
                    f"torch.distributed ({'nccl' if cuda else 'gloo'}) us",
                ],
            )
        )
    if cuda:
        torch.cuda.synchronize()
    comm.close()
    shmem.finalize()
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(f"rank {rank}: the all-reduced layer differs from the reference")


def _kv_gpu(eng, b):
    """(CUDA device, "") when both servers have a GPU and the P2P backend, else
    (None, why): the caches then live in host memory (TCP/SHM backends)."""
    import mori.core
    import mori.io

    ok, why = mori.io.backend_availability().get("P2P", (False, "not in this mori-io"))
    if ok:
        import torch

        ok, why = torch.cuda.is_available(), "torch sees no CUDA device"
    if ok:
        try:
            eng.create_backend(mori.io.BackendType.P2P)
        except (mori.core.NotSupportedError, AttributeError) as e:
            ok, why = False, str(e)
    whys = [w.decode() for w in b.all_gather(b"" if ok else f"no P2P: {why}".encode())]
    if any(whys):
        return None, next(w for w in whys if w)
    local_rank = int(os.environ.get("LOCAL_RANK", b.rank))
    return torch.device("cuda", local_rank % torch.cuda.device_count()), ""


def kv_worker(seed: int) -> None:
    """One server of the KV-cache scene: rank 0 prefills, rank 1 decodes.

    Each owns a paged cache; a request's KV lives in the blocks its own server's
    block table lists (random, different on the two sides). Decode pulls the first
    requests (session batch_read), prefill pushes the others into decode's blocks
    (session batch_write; decode sees them land as inbound statuses). Decode then
    checks its whole cache bit for bit and prints the table."""
    import ctypes
    import itertools
    import random
    import time

    import msgpack

    from mori.core.bootstrap import TcpBootstrap
    from mori.io import (
        BackendType,
        EngineDesc,
        IOEngine,
        MemoryDesc,
        StatusCode,
        allocate_shared_host_memory,
    )

    b = TcpBootstrap.from_env()
    prefill = b.rank == 0
    role = "prefill" if prefill else "decode"
    eng = IOEngine(role)
    eng.create_backend(BackendType.TCP)
    eng.create_backend(BackendType.SHM)
    gpu, why_host = _kv_gpu(eng, b)

    # Each cache's bytes before any transfer; decode knows both to check the result.
    size = KV_LAYERS * KV_BLOCKS * KV_BLOCK_BYTES
    prefill_kv = random.Random(seed).randbytes(size)
    decode_kv = None if prefill else random.Random(seed + 1).randbytes(size)
    start = prefill_kv if prefill else decode_kv
    if gpu is None:
        # Shared host memory (a memfd): the peer maps it once and copies with memcpy.
        cache = allocate_shared_host_memory(size)  # a SharedHostBuffer
        cache[:] = start
        mem = eng.register_array(cache)
    else:
        import torch

        cache = torch.frombuffer(bytearray(start), dtype=torch.uint8).to(gpu)
        mem = eng.register_torch_tensor(cache)

    def snapshot():  # the cache's bytes now, on the host
        if gpu is None:
            return bytes(cache)
        host = cache.cpu()
        return ctypes.string_at(host.data_ptr(), size)

    if prefill:
        where = f"host memory ({why_host})" if why_host else f"{gpu} memory"
        print(f"    seed {seed} (MORI_DEMO_SEED={seed} repeats it); caches in {where}")

    # Block tables, and the uids of prefill's pushes, travel with the descriptors.
    perm = random.Random(seed + 2 + b.rank).sample(range(KV_BLOCKS), KV_BLOCKS)
    ends = itertools.accumulate(KV_REQUESTS)
    tables = [perm[end - n : end] for n, end in zip(KV_REQUESTS, ends, strict=True)]
    uids = [eng.allocate_transfer_uid() for _ in KV_REQUESTS[KV_PULLED:]] if prefill else []
    mine = msgpack.packb([eng.get_engine_desc().pack(), mem.pack(), tables, uids])
    peer_desc, peer_mem, peer_tables, peer_uids = msgpack.unpackb(b.all_gather(mine)[1 - b.rank])
    eng.register_remote_engine(EngineDesc.unpack(peer_desc))
    remote = MemoryDesc.unpack(peer_mem)
    sess = eng.create_session(mem, remote)
    backend, reason = sess.backend()

    deadline = time.monotonic() + 30  # every wait below ends by then

    def left_ms():
        return max(0, int((deadline - time.monotonic()) * 1000))

    def offset(layer, blk):
        return (layer * KV_BLOCKS + blk) * KV_BLOCK_BYTES

    def offsets(table):  # a request's blocks in every layer
        return [offset(layer, blk) for layer in range(KV_LAYERS) for blk in table]

    def transfer(i, uid):  # decode reads request i, prefill writes it
        n = KV_LAYERS * KV_REQUESTS[i]
        op = sess.batch_write if prefill else sess.batch_read
        t0 = time.perf_counter()
        st = op(offsets(tables[i]), offsets(peer_tables[i]), [KV_BLOCK_BYTES] * n, uid)
        if st.WaitFor(left_ms()) == StatusCode.IN_PROGRESS:
            raise SystemExit(f"{role}: request {i} still in flight after 30 s")
        if not st.Succeeded():
            raise SystemExit(f"{role}: request {i} failed: {st.Message()}")
        ms = (time.perf_counter() - t0) * 1e3
        return [i, "prefill writes" if prefill else "decode reads", backend, ms]

    rows = []
    if not prefill:
        rows = [transfer(i, eng.allocate_transfer_uid()) for i in range(KV_PULLED)]
    b.barrier()  # then prefill pushes, decode waits for each push to land
    if prefill:
        rows = [transfer(KV_PULLED + j, uid) for j, uid in enumerate(uids)]
    else:
        for uid in peer_uids:
            while (st := eng.pop_inbound_transfer_status("prefill", uid)) is None:
                if not left_ms():
                    raise SystemExit(f"decode: prefill's write {uid} did not land within 30 s")
                time.sleep(0.001)
            if not st.Succeeded():
                raise SystemExit(f"decode: prefill's write {uid} failed: {st.Message()}")
    unchanged = (snapshot() == prefill_kv) if prefill else True
    reports = b.all_gather(msgpack.packb([rows, unchanged, reason]))
    eng.close()
    if prefill:
        return

    # Decode: every request's blocks hold prefill's bytes, every other block its own.
    got, expected = snapshot(), bytearray(decode_kv)
    push_rows, prefill_unchanged, push_reason = msgpack.unpackb(reports[0])
    verified = []
    for src_table, dst_table in zip(peer_tables, tables, strict=True):
        same = True
        for layer in range(KV_LAYERS):
            for src, dst in zip(src_table, dst_table, strict=True):
                s, d = offset(layer, src), offset(layer, dst)
                block = prefill_kv[s : s + KV_BLOCK_BYTES]
                expected[d : d + KV_BLOCK_BYTES] = block
                same &= got[d : d + KV_BLOCK_BYTES] == block
        verified.append(same)
    rest_ok = got == expected
    from tabulate import tabulate

    body = []
    for i, direction, used, ms in rows + push_rows:
        nbytes = KV_LAYERS * KV_REQUESTS[i] * KV_BLOCK_BYTES
        body.append((i, direction, KV_REQUESTS[i], f"{nbytes / 2**20:.1f} MiB", used, ms,
                     nbytes / ms / 1e6, "yes" if verified[i] else "NO"))  # fmt: skip
    print(f"    request 0: prefill blocks {peer_tables[0]} -> decode blocks {tables[0]}")
    print(tabulate(body, headers=["request", "direction", "blocks", "bytes", "backend", "ms",
                                  "GB/s", "verified"], floatfmt=".2f"))  # fmt: skip
    why = reason if reason == push_reason else f"{reason} (decode); {push_reason} (prefill)"
    print(f"    backend: {why}")
    print(f"    decode cache: {KV_BLOCKS - sum(KV_REQUESTS)} blocks outside the requests "
          f"unchanged: {'yes' if rest_ok else 'NO'}; prefill cache unchanged: "
          f"{'yes' if prefill_unchanged else 'NO'}")  # fmt: skip
    if not (all(verified) and rest_ok and prefill_unchanged):
        raise SystemExit("decode: the KV cache after the transfers is not what was sent")


def kv_scene() -> None:
    """The KV-cache scene: a prefill and a decode server in 2 local processes."""
    from mori.core.launch import launch_local

    print("\n== mori.io: KV-cache transfer from a prefill to a decode server (2 processes;")
    print(f"   paged caches of {KV_LAYERS} layers x {KV_BLOCKS} blocks x "
          f"{KV_BLOCK_BYTES >> 10} KiB, one batch per request)")  # fmt: skip
    seed = int(os.environ.get("MORI_DEMO_SEED") or int.from_bytes(os.urandom(3), "little"))
    env = {"MORI_BOOTSTRAP_TIMEOUT_S": "30"}
    for r in launch_local([__file__, KV_FLAG, str(seed)], 2, timeout_s=60, env=env):
        if r.output.strip():
            print(r.output.rstrip())


def balanced_worker() -> None:
    """One rank of the balanced MoE scene (host heap): a router skewed towards a few hot
    experts, mori.ep.balanced's dispatch (every rank gets exactly S*K rows), each rank's
    experts (local and prefetched: a per-expert linear layer) applied group by group
    from cu_seqlens, the weighted combine, checked against one process's dense layer."""
    import json

    import torch

    from mori.core import shmem
    from mori.core.bootstrap import TcpBootstrap
    from mori.ep import balanced

    b = TcpBootstrap.from_env()
    rank, world = b.rank, b.world_size
    shmem.init(device="cpu", heap_size="64M", bootstrap=b, timeout_s=30)
    S, H, K, epn = 64, 64, 4, 4
    E = epn * world
    buf = balanced.Buffer(S, H, K, E, world, token_padding=8, timeout_s=30)
    # Every rank knows every expert's weight (to check); each owns its epn of them.
    weight = torch.randn(E, H, H, generator=torch.Generator().manual_seed(7)) / H**0.5
    hot = torch.ones(E)
    hot[:2] = 40.0  # experts 0 and 1 (both on rank 0) take most of the traffic
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(S, H, generator=gen).bfloat16()
    idx = torch.multinomial(hot.expand(S, E), K, generator=gen).int()
    w = torch.rand(S, K, generator=gen)
    tpe = torch.bincount(idx.flatten(), minlength=E).int()
    h_nvs, w_nvs, cu, plan = buf.dispatch(x, w, idx, tpe)
    local = weight[rank * epn : (rank + 1) * epn].bfloat16().contiguous()
    pool = shmem.empty((world, epn, H, H), torch.bfloat16)
    zeros = [shmem.empty((world, epn, H, H), torch.bfloat16) for _ in range(2)]
    buf.prefetch_weight(plan, local_gate_weight=local, local_up_weight=local,
                        local_down_weight=local, gate_prefetch_buffer=pool,
                        up_prefetch_buffer=zeros[0], down_prefetch_buffer=zeros[1])  # fmt: skip
    # The compute view: this rank's experts, then its prefetch slots ([2*epn, H, H]).
    view = torch.cat([local, pool[rank]])
    y = torch.zeros_like(h_nvs)
    start = 0
    for g, end in enumerate(cu.tolist()):
        rows = slice(start, end)
        y[rows] = ((h_nvs[rows].float() * w_nvs[rows, None]) @ view[g].float()).bfloat16()
        start = end
    out, _, _ = buf.combine(plan, y)
    ref = sum((x.float() * w[:, k, None]).unsqueeze(1).bmm(weight[idx[:, k].long()]).squeeze(1)
              for k in range(K))  # fmt: skip
    err = float((out.float() - ref).abs().max() / ref.abs().max())
    stats = {"rank": rank, "rows": plan.received_rows(), "slots": plan.remote_stats.tolist(),
             "tpe": tpe.tolist(), "err": err}  # fmt: skip
    rows = [json.loads(blob) for blob in b.all_gather(json.dumps(stats).encode())]
    if rank == 0:
        from tabulate import tabulate

        total = torch.tensor([r["tpe"] for r in rows]).sum(0)
        table = [
            (r["rank"], int(total[r["rank"] * epn : (r["rank"] + 1) * epn].sum()), r["rows"],
             r["slots"][0], f"{r['err']:.1e}")
            for r in rows
        ]  # fmt: skip
        print(tabulate(table, headers=["rank", "rows without balancing", "rows balanced",
                                       "experts prefetched", "max rel err"]))  # fmt: skip
    ok = err < 2e-2 and plan.received_rows() == S * K
    b.barrier()
    buf.destroy()
    del pool, zeros
    shmem.finalize()
    if not ok:
        raise SystemExit(
            f"rank {rank}: balanced layer differs from the dense reference ({err:.3g})"
        )


def balanced_scene() -> None:
    """The balanced MoE scene: 2 local processes on a host heap."""
    from mori.core.launch import launch_local

    print("\n== mori.ep.balanced: an MoE layer on 2 local processes under a skewed router")
    print("   (top-4 of 8 experts, experts 0 and 1 hot); every rank computes exactly S*K rows,")
    print("   checked against the dense layer in one process")
    for r in launch_local([__file__, BALANCED_FLAG], 2, timeout_s=120):
        if r.output.strip():
            print(r.output.rstrip())


def tp_scene() -> None:
    """The tensor-parallel scene: a row-parallel linear layer on 2 local processes."""
    from mori.core.launch import launch_local

    print("\n== mori.ccl: a row-parallel linear layer (16 x 4096 @ 4096 x 1024) on 2 local")
    print("   processes; mori.ccl's all-reduce of the partial products, against the whole")
    print("   layer in one process and beside torch.distributed's all-reduce")
    for r in launch_local([__file__, TP_FLAG], 2, timeout_s=120):
        if r.output.strip():
            print(r.output.rstrip())


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

    kv_scene()

    print("\n== mori.ep: routing layout of 8 tokens, top-2 of 8 experts on 4 ranks")
    dev = "cuda" if torch.cuda.is_available() and mori.ep._C.with_cuda else "cpu"
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

    balanced_scene()
    tp_scene()

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
    elif TP_FLAG in sys.argv:
        tp_worker()
    elif BALANCED_FLAG in sys.argv:
        balanced_worker()
    elif KV_FLAG in sys.argv:
        kv_worker(int(sys.argv[sys.argv.index(KV_FLAG) + 1]))
    else:
        import argparse

        p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        p.add_argument(
            "--scene", choices=("all", "kv", "tp", "balanced"), default="all",
            help="all (default); kv: only mori.io's KV-cache transfer scene; "
            "tp: only mori.ccl's tensor-parallel scene; balanced: only mori.ep.balanced's",
        )  # fmt: skip
        scene = p.parse_args().scene
        if scene == "kv":
            kv_scene()
        elif scene == "balanced":
            balanced_scene()
        elif scene == "tp":
            tp_scene()
        else:
            main()
