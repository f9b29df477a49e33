# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Benchmark of mori.ccl's collectives beside NCCL and torch SymmetricMemory.

    python -m mori.ccl.bench [--world-size N] [--ops all_reduce,all_gather,...]
                             [--sizes 1K,8K,1M] [--dtype bf16] [--modes graph,eager]
                             [--max-blocks 32] [--iters 10] [--json PATH]

Starts ``--world-size`` local processes (default: one per visible GPU, at least 2;
``--world-size 2`` on one GPU shares it: a smoke run, its times are not the
product's) or runs as one rank under torchrun. Rows as nccl-tests prints them: op,
size (nccl-tests' convention: all-reduce the buffer, all-gather the output,
reduce-scatter the input, all-to-all the bytes each rank sends), element count,
dtype, implementation and algorithm, mode, time per call (median over ``--iters``
trials of back-to-back calls: CUDA events around one replay of a graph holding the
calls, or around the calls launched eagerly), algbw = size / time and busbw = algbw x
factor (all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all (n-1)/n).

Beside mori in the same run: NCCL through torch.distributed (a NCCL group; NVLink
multicast off, NCCL_NVLS_ENABLE=0), and for all-reduce torch SymmetricMemory's
one_shot_all_reduce / two_shot_all_reduce_ (TORCH_SYMM_MEM_DISABLE_MULTICAST=1). A
baseline that cannot run here (NCCL refuses two ranks on one GPU) is reported as
skipped with its reason. Inputs are small integers, so every implementation's output
is exact: each is compared with the exact result and, where NCCL ran, bit for bit
with NCCL's.

Without a GPU (or with ``--device cpu``) the collectives run on a host heap beside
gloo, eagerly: that mode checks the bench end to end, its numbers are not the
product's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from mori.core import bench as scaffold

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "int32": "int32"}
MORI_ALGORITHMS = {
    "all_reduce": ("one_shot", "two_shot", "one_shot_ll"),
    "all_gather": ("sm", "copy_engine"),
    "reduce_scatter": ("sm",),
    "all_to_all": ("sm", "copy_engine"),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m mori.ccl.bench",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--world-size", type=int, default=None, help="local processes to start")
    p.add_argument("--ops", type=scaffold.comma_list, default=list(OPS), help=",".join(OPS))
    p.add_argument(
        "--sizes",
        type=lambda t: [scaffold.parse_size(v) for v in scaffold.comma_list(t)],
        default=None,
        help="sizes in bytes (K/M/G suffixes); default 1K to --max-size, x8 steps",
    )
    p.add_argument("--max-size", type=scaffold.parse_size, default=64 << 20)
    p.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    p.add_argument(
        "--modes", type=scaffold.comma_list, default=["graph", "eager"], help="graph,eager"
    )
    p.add_argument("--max-blocks", type=int, default=None, help="mori's bound on blocks per call")
    p.add_argument("--iters", type=int, default=10, help="timed trials (median)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--no-nccl", action="store_true", help="skip the NCCL baseline")
    p.add_argument("--no-symm", action="store_true", help="skip torch SymmetricMemory")
    scaffold.add_output_args(p, json_help="write the rows here (rank 0)")
    p.add_argument("--timeout-s", type=float, default=900.0)
    args = p.parse_args(argv)
    for op in args.ops:
        if op not in OPS:
            p.error(f"op {op!r} is not one of {', '.join(OPS)}")
    for m in args.modes:
        if m not in ("graph", "eager"):
            p.error(f"mode {m!r} is not graph or eager")
    if args.sizes is None:
        args.sizes, s = [], 1024
        while s <= args.max_size:
            args.sizes.append(s)
            s *= 8
    return args


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw."""
    if n <= 1:
        return 1.0
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def _table(rows: list[dict]) -> str:
    headers = ["op", "size", "count", "dtype", "impl", "mode", "time_us", "algbw", "busbw", "check"]
    cells = [
        [
            r["op"],
            str(r["size"]),
            str(r["count"]),
            r["dtype"],
            r["impl"],
            r["mode"],
            f"{r['time_us']:.2f}" if r["time_us"] is not None else "-",
            f"{r['algbw']:.2f}" if r["algbw"] is not None else "-",
            f"{r['busbw']:.2f}" if r["busbw"] is not None else "-",
            r["check"],
        ]
        for r in rows
    ]
    widths = [
        max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)
    ]
    line = lambda c: "  ".join(v.rjust(w) for v, w in zip(c, widths, strict=True))  # noqa: E731
    return "\n".join([line(headers), *(line(c) for c in cells)])


class _Case:
    """One op at one size: the inputs, the exact expected output, and a call per
    implementation that writes into its own output tensor."""

    def __init__(self, torch, op: str, size: int, dtype, world: int, rank: int, device):
        self.op, self.size, self.world, self.rank = op, size, world, rank
        es = torch.tensor([], dtype=dtype).element_size()
        # Elements of this rank's input (nccl-tests' size convention, above).
        if op == "all_gather":
            n = max(size // es // world, 1)
        elif op in ("reduce_scatter", "all_to_all"):
            n = max(size // es // world, 1) * world
        else:
            n = max(size // es, 1)
        self.count = n if op != "all_gather" else n * world
        self.bytes = self.count * es if op != "all_gather" else n * world * es
        idx = torch.arange(n, device=device, dtype=torch.int64)

        def values(r):  # small integers: every sum over <= 8 ranks is exact in bf16
            return ((idx * 7 + r * 13) % 17 - 8).to(dtype)

        self.x = values(rank)
        ins = [values(r) for r in range(world)]
        if op == "all_reduce":
            self.expected = torch.stack([t.double() for t in ins]).sum(0).to(dtype)
        elif op == "all_gather":
            self.expected = torch.cat(ins)
        elif op == "reduce_scatter":
            k = n // world
            self.expected = (
                torch.stack([t[rank * k : (rank + 1) * k].double() for t in ins]).sum(0).to(dtype)
            )
        else:
            k = n // world
            self.expected = torch.cat([t[rank * k : (rank + 1) * k] for t in ins])
        self.out_numel = self.expected.numel()


def _time(torch, cuda: bool, fn, mode: str, calls: int, trials: int, barrier) -> float:
    """Median seconds per call of `fn` over `trials` runs of `calls` back-to-back calls."""
    if cuda and mode == "graph":
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        run = graph.replay
    else:

        def run():
            for _ in range(calls):
                fn()

    run()  # warm-up
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        barrier()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / calls)
        else:
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import mori.ccl as ccl
    from mori.core import shmem

    rank, world, local = scaffold.rank_env()
    cuda, dev, gpus = scaffold.pick_device(args.device, local, ccl._C)
    device = torch.device("cuda", dev) if cuda else torch.device("cpu")
    dist.init_process_group("gloo", init_method="env://")
    dtype = getattr(torch, DTYPES[args.dtype])
    max_bytes = max(args.sizes) + 4096
    heap = 5 * max_bytes + (64 << 20) if cuda else 2 * max_bytes + (16 << 20)
    shmem.init(device=dev if cuda else "cpu", heap_size=scaffold.heap_bytes(heap), timeout_s=120)
    comm = ccl.Communicator(max_bytes=max_bytes, timeout_s=120, max_blocks=args.max_blocks)
    modes = args.modes if cuda else ["eager"]
    # CUDA heaps: inputs copied into it make the "+zc" rows (zero-copy inputs).
    sym_in = comm.empty((max_bytes,), torch.uint8) if cuda else None
    skipped: dict[str, str] = {}

    def barrier():
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()

    base_group = None
    if not args.no_nccl:
        try:
            base_group = dist.new_group(backend="nccl" if cuda else "gloo")
            probe = torch.ones(4, device=device)
            dist.all_reduce(probe, group=base_group)
            if cuda:
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 (NCCL refuses two ranks on one GPU)
            skipped["nccl" if cuda else "gloo"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            base_group = None
    symm = None
    if cuda and not args.no_symm and "all_reduce" in args.ops:
        try:
            import torch.distributed._symmetric_memory as symm_mem

            group = base_group if base_group is not None else dist.group.WORLD
            symm_buf = symm_mem.empty(max_bytes, dtype=torch.uint8, device=device)
            symm_mem.rendezvous(symm_buf, group=group.group_name)
            symm = (symm_mem, symm_buf, group.group_name)
        except Exception as e:  # noqa: BLE001
            skipped["torch_symm_mem"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    base_name = "nccl" if cuda else "gloo"

    rows: list[dict] = []
    for op in args.ops:
        for size in args.sizes:
            case = _Case(torch, op, size, dtype, world, rank, device)
            calls = max(3, min(50, (64 << 20) // max(case.bytes, 1)))
            impls: list[tuple[str, Any]] = []
            for algo in MORI_ALGORITHMS[op]:
                if algo in ("copy_engine", "one_shot_ll") and not cuda:
                    continue
                if algo == "one_shot_ll" and case.bytes > comm._impl.ll_max_bytes:
                    continue
                impls.append((f"mori:{algo}", _mori_call(torch, comm, case, op, algo)))
                if sym_in is not None and algo not in ("copy_engine", "one_shot_ll"):
                    # The same call on a symmetric input, read in place (no staging).
                    impls.append(
                        (f"mori:{algo}+zc", _mori_call(torch, comm, case, op, algo, sym_in))
                    )
            if base_group is not None:
                impls.append((base_name, _dist_call(torch, dist, base_group, case, op)))
            if symm is not None and op == "all_reduce" and case.bytes <= symm[1].numel():
                for algo in ("one_shot", "two_shot"):
                    impls.append((f"symm_mem:{algo}", _symm_call(torch, symm, case, algo)))
            base_out = None
            results = []
            for name, (check_fn, fn, out) in impls:
                try:
                    check_fn()
                    if cuda:
                        torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 (a baseline that does not run here)
                    if name.startswith("mori:"):
                        raise
                    skipped[f"{name} {op} {size}"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
                    continue
                check = "exact" if torch.equal(out.cpu(), case.expected.cpu()) else "WRONG"
                if name == base_name:
                    base_out = out.clone()
                results.append((name, fn, out.clone(), check))
            barrier()
            for name, fn, out, check in results:
                if base_out is not None and name != base_name and check == "exact":
                    check = f"={base_name}" if torch.equal(out, base_out) else f"!={base_name}"
                for mode in modes:
                    try:
                        t = _time(torch, cuda, fn, mode, calls, args.iters, barrier)
                    except Exception as e:  # noqa: BLE001 (a baseline that cannot be captured)
                        skipped[f"{name} {mode}"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
                        barrier()
                        continue
                    algbw = case.bytes / t / 1e9
                    rows.append(
                        dict(
                            op=op,
                            size=case.bytes,
                            count=case.count,
                            dtype=args.dtype,
                            impl=name,
                            mode=mode,
                            time_us=t * 1e6,
                            algbw=algbw,
                            busbw=algbw * bus_factor(op, world),
                            check=check,
                        )
                    )
            barrier()
    if rank == 0:
        meta = dict(
            world_size=world,
            device=torch.cuda.get_device_name(dev) if cuda else "cpu",
            gpus_visible=gpus,
            shared_gpu=cuda and world > gpus,
            torch=torch.__version__,
            mori_ccl=ccl.__version__,
            max_blocks=comm.max_blocks,
            skipped=skipped,
        )
        print(f"# mori.ccl bench: {json.dumps(meta)}")
        if not cuda:
            print("# CPU: host heap beside gloo, a check of the bench, not a measurement")
        print(_table(rows))
        if args.json:
            scaffold.write_json(args.json, {"meta": meta, "records": rows}, indent=1, note=None)
    wrong = [r for r in rows if r["check"] == "WRONG" or r["check"].startswith("!=")]
    barrier()
    comm.close()
    dist.destroy_process_group()
    if wrong:
        raise SystemExit(f"rank {rank}: {len(wrong)} rows with wrong outputs: {wrong[:3]}")


def _mori_call(torch, comm, case: _Case, op: str, algo: str, sym_in=None):
    """(call for the check, call for the timing, output). ``sym_in``: a symmetric
    buffer that the input is copied into first (read in place by the peers)."""
    x = case.x
    if sym_in is not None:
        x = sym_in[: x.numel() * x.element_size()].view(x.dtype).view(x.shape)
        x.copy_(case.x)
    if op == "all_reduce":
        out = torch.empty_like(x)
        fn = lambda: comm.all_reduce(x, out=out, algorithm=algo)  # noqa: E731
        return fn, fn, out
    out = torch.empty(case.out_numel, dtype=x.dtype, device=x.device)
    if op == "all_gather":
        fn = lambda: comm.all_gather(x, out=out, algorithm=algo)  # noqa: E731
    elif op == "reduce_scatter":
        fn = lambda: comm.reduce_scatter(x, out=out)  # noqa: E731
    else:
        fn = lambda: comm.all_to_all(x, out=out, algorithm=algo)  # noqa: E731
    return fn, fn, out


def _dist_call(torch, dist, group, case: _Case, op: str):
    """(call for the check, call for the timing, output). torch's all_reduce is in
    place: the check copies the input first, the timing reduces the output again."""
    x = case.x
    out = torch.empty(case.out_numel, dtype=x.dtype, device=x.device)
    if op == "all_reduce":

        def check():
            out.copy_(x)
            dist.all_reduce(out, group=group)

        return check, (lambda: dist.all_reduce(out, group=group)), out
    if op == "all_gather":
        fn = lambda: dist.all_gather_into_tensor(out, x, group=group)  # noqa: E731
    elif op == "reduce_scatter":
        fn = lambda: dist.reduce_scatter_tensor(out, x, group=group)  # noqa: E731
    else:
        fn = lambda: dist.all_to_all_single(out, x, group=group)  # noqa: E731
    return fn, fn, out


def _symm_call(torch, symm, case: _Case, algo: str):
    """(call for the check, call for the timing, output) of torch SymmetricMemory's
    all-reduce; the input lives in the rendezvoused buffer."""
    _, buf, group_name = symm
    x = case.x
    inp = buf[: x.numel() * x.element_size()].view(x.dtype)
    if algo == "one_shot":
        out = torch.empty_like(x)

        def check():
            inp.copy_(x)
            out.copy_(torch.ops.symm_mem.one_shot_all_reduce(inp, "sum", group_name))

        return check, (lambda: torch.ops.symm_mem.one_shot_all_reduce(inp, "sum", group_name)), out

    def check2():
        inp.copy_(x)
        torch.ops.symm_mem.two_shot_all_reduce_(inp, "sum", group_name)

    return check2, (lambda: torch.ops.symm_mem.two_shot_all_reduce_(inp, "sum", group_name)), inp


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if scaffold.run_or_launch("mori.ccl.bench", argv, parse_args(argv), worker):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
