# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Failures only the device sees end in a trap that names them, on every rank, within
a bounded time — never a hang (EpDispatchCombineOp's docstring lists them). Each case
runs two fresh worker processes (tests/workers/ep_trap_worker.py); their CUDA contexts
are lost afterwards, which is why these are separate processes.

Skipped without a CUDA GPU or a mori build without CUDA.
"""

from pathlib import Path

import pytest

from mori.core.testing import seconds_of, trap_outcomes

WORKER = Path(__file__).parent / "workers" / "ep_trap_worker.py"


def _outcomes(case: str, gpus: int, env: dict[str, str] | None = None) -> list[tuple[str, str]]:
    return trap_outcomes(WORKER, case, gpus, env)


# Both dispatch kernels check ids: the static one in every block, the dynamic one in
# the block whose chunk holds the token.
@pytest.mark.parametrize("kernel", ["static", "dynamic"])
def test_bad_expert_id_traps_on_both_ranks_naming_it(kernel, cuda_gpus):
    env = {"MORI_EP_DISPATCH_DYNAMIC": "1" if kernel == "dynamic" else "0"}
    (o0, out0), (o1, out1) = _outcomes("bad_expert", cuda_gpus, env)
    assert o0.startswith("CUDA error") and o1.startswith("CUDA error"), (o0, o1)
    assert "expert id 8 out of range [-1, 8) at token 3 slot 2" in out0
    assert "dispatch rejected by rank 0" in out1
    # Both launches fail within the op's timeout (3 s in the worker), the peer's after
    # its pause (TrapRejectedBy). Before that pause, two processes sharing one GPU
    # trapped at the same instant and the rejecting one's launch never ended.
    for o in (o0, o1):
        assert seconds_of(o) < 3.0, (o0, o1)


def test_host_rejection_raises_there_and_traps_the_peer(cuda_gpus):
    (o0, _), (o1, out1) = _outcomes("host_reject", cuda_gpus)
    assert o0.startswith("InvalidArgumentError"), o0
    assert "num_tokens 33 exceeds max_num_inp_token_per_rank 32" in o0
    assert o1.startswith("CUDA error"), o1
    assert "dispatch rejected by rank 0" in out1


@pytest.mark.parametrize(
    ("case", "want"),
    [
        ("absent_peer", "mori.ep dispatch (call 1) on rank 0: rank 1 did not arrive (count words)"),
        ("ll_absent_peer", "mori.ep low-latency dispatch (call 1) on rank 0: rank 1 did not "
         "arrive (dispatch flag)"),
        ("ll_async_absent_peer", "mori.ep low-latency dispatch (call 1) on rank 0: rank 1 did "
         "not arrive (dispatch flag)"),
        ("combine_absent", "mori.ep combine (call 1) on rank 0: rank 1 did not arrive (combine "
         "rows)"),
        ("ll_combine_absent", "mori.ep low-latency combine (call 1) on rank 0: rank 1 did not "
         "arrive (combine flag)"),
    ],
)  # fmt: skip
def test_absent_peer_traps_after_the_timeout_naming_it(case, want, cuda_gpus):
    # The CPU implementations raise the same words (test_dispatch_combine.py's and
    # test_low_latency.py's timeout tests).
    (o0, out0), (o1, _) = _outcomes(case, cuda_gpus)
    assert o0.startswith("CUDA error"), o0
    assert seconds_of(o0) < 30
    assert f"{want} within 3000 ms (its last signal is from call " in out0, out0
    assert o1 == "stayed away"


def test_dispatch_past_the_receive_cap_traps_every_rank_naming_the_counts(cuda_gpus):
    (o0, out0), (o1, out1) = _outcomes("over_cap", cuda_gpus)
    want = "dispatch would deliver 11 tokens to rank 0, more than the receive capacity of 10 rows"
    for o, out in ((o0, out0), (o1, out1)):
        assert o.startswith("CUDA error"), (o0, o1)
        assert want in out, out
        assert seconds_of(o) < 3.0, (o0, o1)


@pytest.mark.parametrize("case", ["ll_over_cap", "ll_async_over_cap"])
def test_low_latency_dispatch_past_the_receive_slots_traps_every_rank_naming_the_counts(
    case, cuda_gpus
):
    # max_total_recv_tokens 8 at world 2: 4 slots per source rank; rank 1 routes 5 tokens
    # to rank 0 (rank 0 would receive 8 rows, within W * 4, but the slots are per source).
    (o0, out0), (o1, out1) = _outcomes(case, cuda_gpus)
    want = (
        "dispatch rejected by rank 1: it routes 5 tokens to rank 0, more than the 4 receive "
        "slots per source rank"
    )
    for o, out in ((o0, out0), (o1, out1)):
        assert o.startswith("CUDA error"), (o0, o1)
        assert want in out, out
        assert seconds_of(o) < 3.0, (o0, o1)


def test_ranks_dispatching_different_dtypes_trap_naming_both(cuda_gpus):
    (o0, out0), (o1, out1) = _outcomes("dtype", cuda_gpus)
    assert "rank 1 passes float32 tokens, this rank bfloat16" in out0, out0
    assert "rank 0 passes bfloat16 tokens, this rank float32" in out1, out1
    for o in (o0, o1):
        assert o.startswith("CUDA error"), (o0, o1)
        assert seconds_of(o) < 3.0, (o0, o1)


def test_ranks_combining_different_dtypes_trap_naming_both(cuda_gpus):
    (o0, out0), (o1, out1) = _outcomes("combine_dtype", cuda_gpus)
    assert "rank 1 passes float32 input, this rank bfloat16" in out0, out0
    assert "rank 0 passes bfloat16 input, this rank float32" in out1, out1
    for o in (o0, o1):
        assert o.startswith("CUDA error"), (o0, o1)


@pytest.mark.parametrize("half", ["dispatch", "combine"])
def test_low_latency_ranks_of_different_dtypes_trap_naming_both(half, cuda_gpus):
    (o0, out0), (o1, out1) = _outcomes("ll_dtype" if half == "dispatch" else "ll_combine_dtype",
                                       cuda_gpus)  # fmt: skip
    what = "tokens" if half == "dispatch" else "rows"
    assert f"low-latency {half} on rank 0: rank 1 sends float32 {what}, this rank bfloat16" in out0
    assert f"low-latency {half} on rank 1: rank 0 sends bfloat16 {what}, this rank float32" in out1
    for o in (o0, o1):
        assert o.startswith("CUDA error"), (o0, o1)
        assert seconds_of(o) < 3.0, (o0, o1)


def test_expert_major_ranks_of_different_dtypes_trap_naming_both(cuda_gpus):
    # dispatch_standard_moe's wire tag carries the rows' dtype: bf16 beside fp16 traps
    # on both ranks instead of reading one as the other.
    (o0, out0), (o1, out1) = _outcomes("ll_expert_dtype", cuda_gpus)
    mine0, mine1 = "expert-major bfloat16", "expert-major float16"
    assert f"low-latency dispatch on rank 0: rank 1 sends {mine1} tokens, this rank {mine0}" in out0
    assert f"low-latency dispatch on rank 1: rank 0 sends {mine0} tokens, this rank {mine1}" in out1
    for o in (o0, o1):
        assert o.startswith("CUDA error"), (o0, o1)
        assert seconds_of(o) < 3.0, (o0, o1)


# IntraNode's three combine paths each check the group words (16 tokens x 2 ranks over
# 16 blocks takes the one-pass path by default); the environment forces each one, as in
# test_routing_handles_gpu.py.
COMBINE_PATHS = {
    "onepass": {"MORI_EP_COMBINE_ONEPASS_ROWS": "1000000"},
    "stream": {"MORI_EP_COMBINE_ONEPASS_ROWS": "0"},
    "tiled": {"MORI_EP_COMBINE_ONEPASS_ROWS": "0", "MORI_EP_COMBINE_STREAM": "0"},
}


@pytest.mark.parametrize(
    ("case", "env"),
    [
        pytest.param("combine_weights", e, id=f"combine_weights-{p}")
        for p, e in COMBINE_PATHS.items()
    ]
    + [pytest.param(c, None, id=c) for c in ("ll_combine_weights", "ll_async_combine_weights")],
)
def test_ranks_combining_with_and_without_weights_trap_naming_both(case, env, cuda_gpus):
    # Rank 0 combines with weights, rank 1 with None: IntraNode's group words carry a
    # weights bit, the low-latency flags a weights count; both kernels trap in the CPU
    # implementation's words (test_rank_agreement.py). No time bound beyond the
    # launcher's: the words tell this trap from the 3 s timeout's.
    (o0, out0), (o1, out1) = _outcomes(case, cuda_gpus, env)
    want = "combine weights differ between ranks: rank {} passes {}, this rank passes {}"
    assert want.format(1, "None", "weights") in out0, out0
    assert want.format(0, "weights", "None") in out1, out1
    for o in (o0, o1):
        assert o.startswith("CUDA error"), (o0, o1)
