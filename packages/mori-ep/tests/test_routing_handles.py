# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""MORI's routing handles (``dispatch(..., return_routing=True)``, ``routing=``) on the
CPU implementation, among real processes at world 2 (tests/workers/ep_routing_worker.py:
one scenario per test, fresh random inputs, the seed printed, every row and every
combined value compared bit for bit with a reference)."""


def test_return_routing_gives_moris_handle_and_combine_by_it_matches_combine(run_workers):
    run_workers("ep_routing_worker.py", "cpu", "parity", timeout_s=180)


def test_replay_lays_rows_out_as_the_handles_dispatch_whatever_the_indices(run_workers):
    run_workers("ep_routing_worker.py", "cpu", "replay", timeout_s=180)


def test_micro_batches_in_flight_combine_by_their_handles(run_workers):
    run_workers("ep_routing_worker.py", "cpu", "inflight", timeout_s=180)


def test_combine_order_rules_foreign_handles_and_from_tensors(run_workers):
    run_workers("ep_routing_worker.py", "cpu", "order", timeout_s=180)


def test_combine_reads_an_inconsistent_handle_as_its_rows_say(run_workers):
    run_workers("ep_routing_worker.py", "cpu", "inconsistent", timeout_s=180)


def test_bad_routing_arguments_fail_the_call_on_every_rank(run_workers):
    run_workers("ep_routing_worker.py", "cpu", "errors", timeout_s=180)
