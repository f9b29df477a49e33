# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The proxy among real processes on emulated nodes (CPU; runs in CI): write+signal
ordering with random payloads checked bit for bit, runs of contiguous writes, concurrent
atomic adds, a pe dying mid-stream. Each runs over the automatic paths (mapped within a
node, CMA or TCP across) and with TCP forced across nodes."""

from pathlib import Path

import pytest

import mori.core as mc
from mori.core import proxy, shmem
from mori.core.testing import new_seed, run_ranks

WORKER = str(Path(__file__).parent / "workers" / "proxy_worker.py")
SCATTER_WORKER = str(Path(__file__).parent / "workers" / "proxy_scatter_worker.py")


def _run(mode, world, transport, per_node, *extra, timeout_s=240):
    argv = [WORKER, mode, str(new_seed()), transport, str(per_node), *extra]
    return run_ranks(argv, world, timeout_s=timeout_s, who="pe")


# (world, pes per node): 2 nodes x 1, 2 nodes x 2.
LAYOUTS = [(2, 1), (4, 2)]


@pytest.mark.parametrize("transport", ["auto", "tcp"])
@pytest.mark.parametrize(("world", "per_node"), LAYOUTS)
def test_write_then_signal_ordering_bit_for_bit(world, per_node, transport):
    _run("order", world, transport, per_node, "60")


@pytest.mark.parametrize("transport", ["auto", "tcp"])
@pytest.mark.parametrize(("world", "per_node"), LAYOUTS)
def test_runs_of_contiguous_writes_land_bit_for_bit(world, per_node, transport):
    _run("pieces", world, transport, per_node, "12")


# Only source and destination both continuing may merge two writes.
@pytest.mark.parametrize("variant", ["src-shuffled", "dst-shuffled"])
@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_runs_continuing_on_one_side_only_land_bit_for_bit(variant, transport):
    _run(f"pieces-{variant}", 4, transport, 2, "6")


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_retired_writes_source_may_be_overwritten(transport):
    _run("pieces-retired", 4, transport, 2, "4")


def test_chained_writes_to_oneself_apply_one_by_one():
    _run("selfchain", 2, "auto", 2, "200")


@pytest.mark.parametrize("layout", ["scatter", "runs"])
@pytest.mark.parametrize("per_node", [1, 2], ids=["two-nodes-tcp", "one-node-mapped"])
def test_a_scatter_of_writes_lands_bit_for_bit(per_node, layout):
    pytest.importorskip("torch")
    # The same worker runs on a CUDA heap in test_proxy_gpu.py (the staging paths).
    argv = [SCATTER_WORKER, str(new_seed()), str(per_node), "cpu", layout]
    run_ranks(argv, 2, timeout_s=240, who="pe")


@pytest.mark.parametrize("transport", ["auto", "tcp"])
@pytest.mark.parametrize(("world", "per_node"), LAYOUTS)
def test_concurrent_atomic_adds_sum_exactly(world, per_node, transport):
    _run("atomic", world, transport, per_node, "300")


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_pe_dying_mid_stream_is_named_on_every_other_pe(transport):
    results = _run("die", 4, transport, 2)
    for r in results[:-1]:
        assert "pe 3 (node 'env:n1')" in r.output, r.output


def test_a_stopped_pe_is_named_within_the_timeout():
    """A peer that stops without closing (SIGSTOP): its receive buffers fill, the
    sender's writes stall, and within the 3 s timeout the proxy fails naming it."""
    results = _run("stuck", 2, "tcp", 1, timeout_s=120)
    assert "named: " in results[0].output


def test_offsets_and_bad_arguments_are_refused():
    shmem.init(device="cpu", heap_size="4M", bootstrap=mc._C.TcpBootstrap(0, 1))
    try:
        p = proxy.Proxy(mc._C.TcpBootstrap(0, 1), timeout_s=10)
        buf = shmem.malloc(4096)
        assert proxy.heap_offset(buf + 8) == proxy.heap_offset(buf) + 8
        with pytest.raises(mc.InvalidArgumentError, match="not in this pe's symmetric heap"):
            proxy.heap_offset(12345)
        with pytest.raises(mc.InvalidArgumentError, match="queue 5 out of range"):
            p.quiet(queue=5)
        with pytest.raises(mc.InvalidArgumentError, match="op 'read'"):
            p._p.push("read", 0)
        assert p.path_to(0) == "mapped"
        p.close()
        with pytest.raises(mc.InvalidStateError, match="closed"):
            p.write(0, 0, 0, 8)
    finally:
        shmem.finalize(force=True)


def test_proxy_before_shmem_is_a_clear_error():
    assert not shmem.initialized()
    with pytest.raises(mc.InvalidStateError, match="shmem is not initialized"):
        proxy.Proxy(mc._C.TcpBootstrap(0, 1))


VERBS_WORKER = str(Path(__file__).parent / "workers" / "proxy_verbs_worker.py")


def test_verbs_without_a_nic_fails_on_every_pe_naming_each():
    """MORI_PROXY_TRANSPORT=verbs where no pe can open an RDMA port (no NIC here): every
    pe refuses with each pe's reason, none hangs. On a machine with a NIC the worker
    instead moves one write+add over RDMA and checks it."""
    results = run_ranks([VERBS_WORKER, "all", str(new_seed())], 2, timeout_s=120, who="pe")
    for r in results:
        assert "refused: " in r.output or "verbs worked" in r.output, r.output


def test_verbs_chosen_by_some_pes_only_is_refused_on_every_pe():
    results = run_ranks([VERBS_WORKER, "mixed", str(new_seed())], 2, timeout_s=120, who="pe")
    for r in results:
        assert "must be the same on every pe" in r.output, r.output
