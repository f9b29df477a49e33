# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""MORI's routing handles (``dispatch(..., return_routing=True)``, ``routing=``) on the
CPU implementation, among real processes at world 2 (tests/workers/ep_routing_worker.py:
one scenario per test, fresh random inputs, the seed printed, every row and every
combined value compared bit for bit with a reference)."""

import random
from pathlib import Path

from mori.core.launch import launch_local

WORKER = str(Path(__file__).parent / "workers" / "ep_routing_worker.py")


def run_scenario(scenario: str) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    results = launch_local([WORKER, "cpu", scenario, str(seed)], 2, timeout_s=180)
    for r in results:
        assert r.output.strip().endswith(f"rank {r.rank} ok"), r.output


def test_return_routing_gives_moris_handle_and_combine_by_it_matches_combine():
    run_scenario("parity")


def test_replay_lays_rows_out_as_the_handles_dispatch_whatever_the_indices():
    run_scenario("replay")


def test_micro_batches_in_flight_combine_by_their_handles():
    run_scenario("inflight")


def test_combine_order_rules_foreign_handles_and_from_tensors():
    run_scenario("order")


def test_bad_routing_arguments_fail_the_call_on_every_rank():
    run_scenario("errors")
