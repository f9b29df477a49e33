# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The inter-node CUDA kernels (InterNode, InterNodeV1, InterNodeV1LL) among real
processes sharing GPU 0, nodes emulated by gpu_per_node (the proxy's mapped path: CUDA
IPC copies) or as separate hosts (MORI_SHMEM_NODE_ID, the proxy's TCP path staged
through pinned memory): the worker and reference of test_internode.py, bit for bit
(dispatch rows and metadata, combine sums, every rank's byte counts). Skipped without a
CUDA GPU or a mori build without CUDA. Also: dispatch and combine captured in a CUDA graph
and replayed with fresh inputs (every kind, InterNodeV1LL over TCP too)."""

from pathlib import Path

import pytest

from mori.core.testing import new_seed, run_ranks

WORKER = str(Path(__file__).parent / "workers" / "ep_internode_worker.py")


def _run(kind, world, local, nodes, iters=8, timeout_s=300, mode="random", env=None):
    argv = [WORKER, mode, str(new_seed()), kind, str(local), str(iters), nodes, "shared"]
    results = run_ranks(argv, world, timeout_s=timeout_s, env=env)
    return [r.output.strip().splitlines()[-2] for r in results]


# 2 nodes x 1 (every token to the other rank crosses the proxy) and 2 nodes x 2 (rows
# to this node's other rank by load/store, to the other node's through the proxy; V1:
# once per node, forwarded by the gateway; V1LL: into fixed slots, compacted); bf16, fp8 with scales and bf16 with
# fp8_direct_cast; ranks with no tokens, -1 slots.
@pytest.mark.parametrize("kind", ["InterNode", "InterNodeV1", "InterNodeV1LL"])
@pytest.mark.parametrize(("world", "local"), [(2, 1), (4, 2)])
@pytest.mark.parametrize("nodes", ["mapped", "tcp"])
def test_internode_kernels_match_the_reference_bit_for_bit(kind, world, local, nodes, cuda_gpus):
    out = _run(kind, world, local, nodes)
    print("\n".join(out))
    want = "tcp" if nodes == "tcp" else "mapped"
    assert all("kernel producer" in line and want in line for line in out), out


# Routing handles: two micro-batches combined by their handles in order, one replayed
# with a new payload (the kernels read the handle's copies of the routing regions).
# mori.ep makes a handle with torch ops right after the dispatch launch; under CUDA's
# lazy loading a torch kernel's first launch may wait for the context while the
# dispatch kernel waits for the proxy (CUDA documents the deadlock), so the torch
# kernels are loaded eagerly here.
@pytest.mark.parametrize(("kind", "world", "local"), [("InterNodeV1", 4, 2), ("InterNode", 2, 1)])
def test_routing_handles_on_the_kernels(kind, world, local, cuda_gpus):
    env = {"CUDA_MODULE_LOADING": "EAGER"}
    print("\n".join(_run(kind, world, local, "mapped", mode="routing", env=env)))


# CUDA graphs: dispatch, dispatch, combine captured once and replayed with fresh inputs,
# then a dispatch graph and a combine graph replayed as dispatch, dispatch, combine (the
# kernels number their calls on the device; V1LL's second dispatch exchanges the first
# one's done words, as the device's state tells it), each replay bit for bit against
# the reference, byte counts included; the proxy thread serves the replays. The expert
# runs on the GPU inside the graph, so torch's kernels are loaded eagerly (see the
# routing test above; the worker also runs them once before the first dispatch).
@pytest.mark.parametrize("kind", ["InterNodeV1LL", "InterNodeV1", "InterNode"])
@pytest.mark.parametrize(("world", "local"), [(2, 1), (4, 2)])
def test_captured_calls_replay_bit_for_bit(kind, world, local, cuda_gpus):
    env = {"CUDA_MODULE_LOADING": "EAGER"}
    print("\n".join(_run(kind, world, local, "mapped", iters=6, mode="graph", env=env)))


def test_captured_low_latency_calls_replay_over_tcp(cuda_gpus):
    env = {"CUDA_MODULE_LOADING": "EAGER"}
    print("\n".join(_run("InterNodeV1LL", 2, 1, "tcp", iters=4, mode="graph", env=env)))
