# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The inter-node kernel types (InterNode, InterNodeV1, InterNodeV1LL) on CPU among real
processes, nodes emulated on one host (tests/workers/ep_internode_worker.py): every
result and every rank's byte count equal to tests/workers/ep_internode_reference.py's
bit for bit, over the proxy's mapped, CMA and TCP paths; rejected inputs fail every
rank, as do ranks combining with and without weights; a node that dies is named on
every surviving rank; a full command queue back-pressures without losing a command."""

from pathlib import Path

import pytest
import torch

import mori.core as mc
from mori.core.testing import new_seed, run_ranks
from mori.ep import EpDispatchCombineConfig, EpDispatchCombineKernelType, EpDispatchCombineOp

WORKER = str(Path(__file__).parent / "workers" / "ep_internode_worker.py")
KINDS = ["InterNode", "InterNodeV1", "InterNodeV1LL"]


def _run(mode, kind, world, local, iters=8, nodes="mapped", env=None, timeout_s=240, rows=""):
    argv = [WORKER, mode, str(new_seed()), kind, str(local), str(iters), nodes, rows]
    return run_ranks(argv, world, timeout_s=timeout_s, env=env)


def _summary(results):
    return [r.output.strip().splitlines()[-2] for r in results]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("world", "local"), [(2, 1), (4, 2)])
def test_matches_the_reference_bit_for_bit(kind, world, local):
    # world 2: two nodes of one rank (every token crosses or stays); world 4: two nodes
    # of two (forwarding by the gateway). bf16, fp8 with scales, fp8_direct_cast.
    print("\n".join(_summary(_run("random", kind, world, local))))


@pytest.mark.parametrize(("kind", "local"), [("InterNodeV1", 4), ("InterNodeV1LL", 2)])
def test_world_8(kind, local):
    # 2 nodes x 4 and 4 nodes x 2 (few calls: 8 processes share the CI's cores).
    print("\n".join(_summary(_run("random", kind, 8, local, iters=3, timeout_s=400))))


@pytest.mark.parametrize("nodes", ["hosts", "tcp"])
def test_nodes_as_separate_hosts_over_the_proxy_transports(nodes):
    # MORI_SHMEM_NODE_ID splits the heap: other nodes are not mapped, so every byte to
    # them goes through the proxy's CMA (same host) or TCP transport.
    out = _summary(_run("random", "InterNodeV1", 4, 2, iters=4, nodes=nodes))
    print("\n".join(out))
    want = "cma" if nodes == "hosts" else "tcp"
    assert all(want in line or "tcp" in line for line in out), out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("world", "local"), [(2, 1), (4, 2)])
def test_a_dispatch_right_after_a_dispatch(kind, world, local):
    # Dispatch, dispatch, combine with static shapes and fresh inputs (the calls the
    # CUDA-graph test captures; V1LL's second dispatch first exchanges the first one's
    # done words): both dispatches, the combine and the byte counts bit for bit.
    print("\n".join(_summary(_run("graph", kind, world, local, iters=3))))


@pytest.mark.parametrize("kind", KINDS)
def test_large_rows_wrap_the_send_ring(kind):
    # Rows of 7168 bf16 and 160 tokens per rank over TCP: each call's link payload wraps
    # the proxy link's 1 MiB send ring several times while runs of every field to two
    # peers are open, so a ring range reused before its command retired shows up as a
    # wrong result.
    out = _summary(_run("random", kind, 4, 2, iters=2, nodes="tcp", rows="large", timeout_s=400))
    print("\n".join(out))


def test_the_heap_link_gives_the_same_results_and_counts():
    # MORI_EP_INTERNODE_LINK=heap: direct copies through the heap instead of the proxy
    # (the baseline); the reference and the byte counts are the same.
    out = _summary(
        _run("random", "InterNodeV1", 4, 2, iters=4, env={"MORI_EP_INTERNODE_LINK": "heap"})
    )
    print("\n".join(out))
    assert all("same-host heap copy" in line for line in out), out


def test_a_full_command_queue_back_pressures():
    # Two slots per queue: almost every push waits for the proxy to free one; nothing
    # is dropped, so every result is still exact.
    out = _summary(
        _run("random", "InterNodeV1", 4, 2, iters=4, env={"MORI_PROXY_QUEUE_CAPACITY": "2"})
    )
    print("\n".join(out))


@pytest.mark.parametrize(("kind", "world", "local"), [("InterNodeV1", 4, 2), ("InterNode", 2, 1)])
def test_routing_handles_combine_in_order_and_replay(kind, world, local):
    _run("routing", kind, world, local)


@pytest.mark.parametrize(
    ("kind", "world", "local"), [("InterNodeV1", 4, 2), ("InterNodeV1LL", 2, 1)]
)
def test_rejected_inputs_fail_every_rank(kind, world, local):
    _run("errors", kind, world, local)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("world", "local"), [(2, 1), (4, 2)])
def test_ranks_combining_with_and_without_weights_fail_every_rank(kind, world, local):
    # One rank passes combine weights, the others None (and the reverse): a gateway
    # builds the partial weights only when its own call has weights, so the call fails
    # on every rank naming the other rank and what it passes; then it works again.
    _run("weights", kind, world, local)


@pytest.mark.parametrize(
    ("kind", "nodes"),
    [("InterNode", "mapped"), ("InterNodeV1", "mapped"), ("InterNodeV1LL", "tcp")],
)
def test_a_dead_node_is_named_on_every_surviving_rank(kind, nodes):
    results = _run("death", kind, 4, 2, nodes=nodes, timeout_s=120)
    for r in results[:2]:
        assert "(node 1)" in r.output, r.output


def _config(**kw):
    base = dict(
        data_type=torch.bfloat16, rank=0, world_size=1, hidden_dim=128, scale_dim=0,
        scale_type_size=4, max_token_type_size=2, max_num_inp_token_per_rank=8,
        num_experts_per_rank=2, num_experts_per_token=2,
        kernel_type=EpDispatchCombineKernelType.InterNodeV1,
    )  # fmt: skip
    base.update(kw)
    return EpDispatchCombineConfig(**base)


def test_inter_node_configs_keep_moris_fields():
    c = _config(gpu_per_node=4, rdma_block_num=64, num_qp_per_pe=2, max_total_recv_tokens=8)
    assert (c.gpu_per_node, c.rdma_block_num, c.num_qp_per_pe) == (4, 64, 2)
    raw = c.to_cpp_config()
    assert (raw.kernel_type, raw.gpu_per_node, raw.rdma_block_num) == (2, 4, 64)


@pytest.mark.parametrize(
    ("gpu_per_node", "message"),
    [(0, "gpu_per_node 0 must be a positive int"), ("8", "gpu_per_node '8' must be")],
)
def test_bad_gpu_per_node_is_refused_naming_it(gpu_per_node, message):
    with pytest.raises(mc.InvalidArgumentError, match=message):
        _config(gpu_per_node=gpu_per_node)


def test_the_op_needs_a_heap_first():
    with pytest.raises(mc.InvalidStateError, match=r"needs mori.core.shmem.init\(\) first"):
        EpDispatchCombineOp(_config())


@pytest.mark.parametrize("kind", [1, 2, 3])
def test_the_kernels_layout_extends_the_host_layout(kind):
    # The CUDA kernels' block (device=True) adds private staging regions after the host
    # implementation's; every region mori.ep reads sits at the same offset in both.
    # Among the kernels' regions, `state`: the calls' numbers the kernels keep (8 words,
    # what mori.ep's routing handles read as the dispatch epoch on CUDA).
    from mori.ep._C import internode_buffer_layout

    shape = (4, 1, 24, 4, 256, 2, 8, 4)
    host = internode_buffer_layout(*shape, recv_capacity=96, kind=kind, local_size=2)
    dev = internode_buffer_layout(*shape, recv_capacity=96, kind=kind, local_size=2, device=True)
    shared = set(host) - {"total_bytes", "state"}
    assert {k: dev[k] for k in shared} == {k: host[k] for k in shared}
    assert dev["total_bytes"] > host["total_bytes"] > dev["token_ranks"]
    assert host["total_bytes"] <= dev["state"] and dev["state"] % 256 == 0
    assert dev["state"] + 64 <= dev["total_bytes"]
