# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Rank 0's report of ``python -m mori.ep.bench``: the tables, the references, the
comparisons, the JSON and the plot."""

from __future__ import annotations

from mori.core import bench as scaffold

from . import internode
from .baseline import PEER_COPY_BYTES


def or_dash(v):
    return "-" if v is None else v


def report(args, meta, records) -> None:
    cuda = meta["device"] != "cpu"
    print(
        f"mori.ep bench: {meta['world_size']} ranks on {meta['device']}, hidden "
        f"{meta['hidden_dim']}, top-{meta['num_experts_per_token']} of "
        f"{meta['num_experts_per_rank'] * meta['world_size']} experts, warps/block "
        f"{meta['warp_per_block']}; {meta['timing']}; median of {meta['iters']} trials"
    )
    headers = [
        "tokens",
        "dtype",
        "impl",
        "blocks",
        "rank",
        "recv rows",
        "disp us",
        "disp GB/s",
        "disp cross GB/s",
        "disp kern us",
        "comb us",
        "comb GB/s",
        "comb cross GB/s",
        "comb kern us",
    ]
    rows = []
    order = sorted(
        records,
        key=lambda r: (r["tokens"], r["dtype"], r["impl"] != "mori", r["block_num"], r["rank"]),
    )
    for r in order:
        rows.append(
            [
                r["tokens"],
                r["dtype"],
                r["impl"],
                r["block_num"] or "-",
                r["rank"],
                r["recv_rows"],
                r["dispatch_us"],
                r["dispatch_gbps"],
                r["dispatch_cross_gbps"],
                or_dash(r.get("dispatch_kernel_us")),
                r["combine_us"],
                r["combine_gbps"],
                r["combine_cross_gbps"],
                or_dash(r.get("combine_kernel_us")),
            ]
        )
    print(scaffold.table(rows, headers))
    print(
        "GB/s: bytes received per rank incl. the copy to itself (MORI/DeepEP); cross: "
        "cross-GPU (cross-rank) bytes only; combine counts the bf16 rows sent back "
        "(fp8_blockwise rows: the bytes that cross); "
        "us: per call (CUDA events around each graph replay); kern us: the kernel's own "
        "GPU time (profiler, median; as DeepEP measures)"
    )
    floors_table(meta, order)
    inter = internode.table(records)
    if inter:
        print(
            f"inter-node kernel types, {meta['gpu_per_node']} rank(s) per emulated node, proxy "
            f"transport {meta['proxy_transport'] or 'none (one node)'}; slowest rank per column: "
            + ("us = CUDA events around each eager call (each followed by a stream "
               "synchronisation; host launch included), kern us = the kernels' GPU time "
               "(profiler); " if cuda else "us = wall clock per call; ")
            + "algo = token rows x destination nodes incl. its own (InterNode: x destination "
            "ranks), phys = the crossings to other nodes, link = what the op put on its "
            "inter-node link (rows, metadata, signals), moved = what the proxy reports it "
            "moved (link without the signals); raw = the same link bytes over a plain "
            "TCP stream between the same processes, from and into buffers of their size"
            + (", GPU buffers staged through pinned 1 MiB chunks as the proxy stages" if cuda
               else "")
            + "; mori-io = mori-io's TCP batch of the same bytes; raw 1MiB = the plain stream "
            "of one cached 1 MiB block; leg = the op's link commands of the call replayed "
            "alone (proxy + TCP; host heaps only); copy = one copy of the link bytes in this "
            "rank's memory (" + ("device copy_, GPU time" if cuda else "host") + ", the "
            "floor) (mori.ep.bench.internode); op / x = x us / us, leg / x = x us / leg us"
        )  # fmt: skip
        if meta.get("shared_gpu"):
            print(
                f"NOTE: {meta['world_size']} processes share {meta['gpus']} GPU(s): their kernels "
                "time-slice it and their proxies move bytes through its memory and loopback "
                "TCP, so these figures measure the proxy's overhead and the kernels' "
                "correctness, not a NIC; no all_to_all baseline (NCCL cannot put two ranks on "
                "one GPU)"
            )
        print(scaffold.table(*inter))
    if meta["peer_copy_gbps"]:
        print(
            f"peer copy reference (copy engine, rank 0 -> rank 1, "
            f"{PEER_COPY_BYTES >> 20} MiB): {meta['peer_copy_gbps']:.1f} GB/s"
        )
    a2a = meta.get("a2a_reference")
    if meta.get("shared_gpu") and not args.no_baseline:
        print("no all_to_all baseline: ranks share a GPU (NCCL cannot put two ranks on one GPU)")
    if a2a:
        print(
            f"all_to_all_single reference ({a2a['backend']}, {a2a['bytes'] >> 20} MiB per rank, "
            f"slowest rank's median {a2a['us']:.1f} us): algbw {a2a['algbw_gbps']:.1f} GB/s, "
            f"busbw {a2a['busbw_gbps']:.1f} GB/s (nccl-tests' definitions)"
        )
    # Speed-up over the baseline, slowest rank of each.
    base = [r for r in records if r["impl"].startswith("a2a")]
    if base:
        mism = [r for r in base if not r.get("matches_mori", True)]
        print(
            "baseline combine output matches mori's: "
            + ("yes, every case" if not mism else f"NO in {len(mism)} case(s)")
        )
        for n in args.tokens:
            for dt in args.dtype:
                b = [r for r in base if r["tokens"] == n and r["dtype"] == dt]
                if not b:
                    continue
                bd = max(r["dispatch_us"] for r in b)
                bc = max(r["combine_us"] for r in b)
                for blocks in sorted({r["block_num"] for r in records if r["impl"] == "mori"}):
                    mr = [
                        r
                        for r in records
                        if r["impl"] == "mori"
                        and r["tokens"] == n
                        and r["dtype"] == dt
                        and r["block_num"] == blocks
                    ]
                    md = max(r["dispatch_us"] for r in mr)
                    mc = max(r["combine_us"] for r in mr)
                    print(
                        f"  {n:>5} tokens {dt}{f' {blocks} blocks' if cuda else ''}: "
                        f"dispatch {md:.1f} us vs {bd:.1f} us ({bd / md:.2f}x), combine "
                        f"{mc:.1f} us vs {bc:.1f} us ({bc / mc:.2f}x)"
                    )
    if meta.get("overlap"):
        print("AsyncLL overlap (per phase: transfer alone T, GEMM alone G, send + GEMM + recv "
              "O; hidden = 1 - (O - G) / T):")  # fmt: skip
        print(scaffold.table(
            [[r["tokens"], r["dtype"], r["impl"], r["phase"], r["rank"], r["transfer_us"],
              r["gemm_size"], r["gemm_us"], r["overlapped_us"], f"{100 * r['hidden']:.0f} %"]
             for r in sorted(meta["overlap"], key=lambda r: (r["tokens"], r["dtype"], r["impl"],
                                                             r["phase"], r["rank"]))],
            ["tokens", "dtype", "impl", "phase", "rank", "T us", "GEMM n", "G us", "O us",
             "hidden"],
        ))  # fmt: skip
    wire = [r for r in records if "combine_wire_bytes" in r]
    if wire:
        print(
            "standard-moe combine, bytes each rank sends back (cross-rank in brackets; "
            "partials: one fp32 row per received token, rows: one bf16 row per expert):"
        )
        print(scaffold.table(
            [[r["tokens"], r["dtype"], r["impl"], r["rank"],
              "partials" if r["pre_reduce"] else "rows",
              f"{r['combine_wire_bytes'] / 1e6:.3f} ({r['combine_wire_cross_bytes'] / 1e6:.3f})",
              r["combine_us"], or_dash(r.get("combine_kernel_us"))]
             for r in sorted(wire, key=lambda r: (r["tokens"], r["dtype"], r["impl"], r["rank"]))],
            ["tokens", "dtype", "impl", "rank", "sends", "MB sent", "comb us", "comb kern us"],
        ))  # fmt: skip
    quant_table(records)
    same = [r.get("matches_intranode") for r in records if "matches_intranode" in r]
    if len({r["impl"] for r in records if "matches_intranode" in r}) > 1:
        print(
            "token-major kernel types' combine outputs identical: "
            + ("yes, every case" if all(same) else f"NO in {same.count(False)} case(s)")
        )
    if args.json:
        scaffold.write_json(args.json, {"meta": meta, "records": records})
    if args.plot:
        plot(args.plot, meta, records)


def quant_table(records) -> None:
    """With --combine-quant fp8_blockwise: each quantized combine beside the bf16
    combine of the same case (kernel type, tokens, dtype, blocks, rank)."""
    quant = [r for r in records if r.get("combine_quant", "none") != "none"]
    if not quant:
        return
    key = lambda r: (r["kernel_type"], r["tokens"], r["dtype"], r["block_num"], r["rank"])  # noqa: E731
    bf16 = {key(r): r for r in records if r.get("combine_quant") == "none"}
    rows = []
    for r in sorted(quant + list(bf16.values()), key=lambda r: (key(r), r["combine_quant"])):
        if key(r) not in {key(q) for q in quant}:
            continue
        base = bf16.get(key(r))
        mine = r.get("combine_kernel_us") or r["combine_us"]
        ref = (base.get("combine_kernel_us") or base["combine_us"]) if base else None
        rows.append([
            r["tokens"], r["dtype"], r["kernel_type"], r["block_num"] or "-", r["rank"],
            r["combine_quant"],
            f"{r['combine_sent_bytes'] / 1e6:.3f} ({r['combine_sent_cross_bytes'] / 1e6:.3f})",
            r["combine_us"], or_dash(r.get("combine_kernel_us")),
            f"{mine / ref:.2f}x" if ref else "-",
            f"{r['combine_rel_diff_vs_bf16']:.2e}" if "combine_rel_diff_vs_bf16" in r else "-",
        ])  # fmt: skip
    print(
        "combine by quant type, same run: MB each rank sends back incl. the copy to itself "
        "(cross-rank in brackets); x bf16: kernel time over the bf16 combine's; diff: "
        "largest |output - bf16 output| / largest |bf16 output|"
    )
    print(scaffold.table(rows, [
        "tokens", "dtype", "kernel", "blocks", "rank", "quant", "MB sent", "comb us",
        "comb kern us", "x bf16", "diff",
    ]))  # fmt: skip


def floors_table(meta, records) -> None:
    """Each row's kernel time beside the floors measured in the same run (floors.py):
    a copy of its bytes and the same call in plain torch, as multiples."""
    rows = []
    for r in records:
        if "floor_dispatch_copy_us" not in r:
            continue
        row = [r["tokens"], r["dtype"], r["impl"], r["block_num"] or "-", r["rank"]]
        for phase in ("dispatch", "combine"):
            mine = r.get(f"{phase}_kernel_us") or r[f"{phase}_us"]
            copy, plain = r[f"floor_{phase}_copy_us"], r[f"floor_{phase}_torch_us"]
            row += [mine, copy, plain, f"{mine / copy:.1f}x" if copy else "-",
                    f"{mine / plain:.2f}x" if plain else "-"]  # fmt: skip
        rows.append(row)
    if not rows:
        return
    empty = meta.get("floor_empty_us")
    print(
        "floors, same run (GPU time per call; CPU: wall clock): copy = one device copy of "
        "the call's bytes, torch = the same call in plain torch on this GPU"
        + (f"; an empty kernel, graph replay: {empty:.2f} us" if empty else "")
    )
    print(scaffold.table(rows, [
        "tokens", "dtype", "impl", "blocks", "rank",
        "disp kern us", "copy us", "torch us", "/copy", "/torch",
        "comb kern us", "copy us", "torch us", "/copy", "/torch",
    ]))  # fmt: skip


def plot(path, meta, records) -> None:
    plt = scaffold.pyplot(path)
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    series = sorted({(r["impl"], r["dtype"], r["block_num"]) for r in records})
    for ax, phase in zip(axes, ("dispatch", "combine"), strict=True):
        for impl, dt, blocks in series:
            pts = sorted(
                (r["tokens"], r[f"{phase}_cross_gbps"])
                for r in records
                if (r["impl"], r["dtype"], r["block_num"]) == (impl, dt, blocks) and r["rank"] == 0
            )
            label = f"{impl} {dt}" + (f" {blocks} blk" if blocks else "")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        if meta["peer_copy_gbps"]:
            ax.axhline(meta["peer_copy_gbps"], color="gray", ls="--", label="peer copy")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens per rank")
        ax.set_title(f"{phase}, rank 0, cross-GPU GB/s")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GB/s")
    axes[1].legend(fontsize=7)
    fig.suptitle(f"mori.ep, {meta['world_size']} x {meta['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")
