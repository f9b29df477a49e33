# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Failures only the device sees end in a trap that names them, on every rank, within
a bounded time — never a hang (EpDispatchCombineOp's docstring lists them). Each case
runs two fresh worker processes (tests/workers/ep_trap_worker.py); their CUDA contexts
are lost afterwards, which is why these are separate processes.

Skipped without a CUDA GPU or a mori build without CUDA.
"""

import re
from pathlib import Path

import pytest

import mori.core as mc
from mori.core.launch import launch_local

torch = pytest.importorskip("torch")

WORKER = str(Path(__file__).parent / "workers" / "ep_trap_worker.py")
ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def _placement() -> str:
    import mori.ep

    if not mc.build_info().get("with_cuda") or not mori.ep._C.with_cuda:
        pytest.skip("mori was built without CUDA")
    if not torch.cuda.is_available() or mc.build_info().get("cuda_device_count", 0) == 0:
        pytest.skip("no CUDA GPU")
    return "per_gpu" if mc.build_info()["cuda_device_count"] >= 2 else "shared"


def _outcomes(case: str, env: dict[str, str] | None = None) -> list[tuple[str, str]]:
    results = launch_local(
        [WORKER, case, _placement()], 2, timeout_s=120, env={**ENV, **(env or {})}
    )
    out = []
    for r in results:
        print(f"----- rank {r.rank} -----\n{r.output}")
        m = re.search(rf"rank {r.rank} outcome: (.*)\n", r.output)
        assert m and r.output.strip().endswith(f"rank {r.rank} ok"), r.output
        out.append((m.group(1), r.output))
    return out


# Both dispatch kernels check ids: the static one in every block, the dynamic one in
# the block whose chunk holds the token.
@pytest.mark.parametrize("kernel", ["static", "dynamic"])
def test_bad_expert_id_traps_on_both_ranks_naming_it(kernel):
    env = {"MORI_EP_DISPATCH_DYNAMIC": "1" if kernel == "dynamic" else "0"}
    (o0, out0), (o1, out1) = _outcomes("bad_expert", env)
    assert o0.startswith("CUDA error") and o1.startswith("CUDA error"), (o0, o1)
    assert "expert id 8 out of range [-1, 8) at token 3 slot 2" in out0
    assert "dispatch rejected by rank 0" in out1


def test_host_rejection_raises_there_and_traps_the_peer():
    (o0, _), (o1, out1) = _outcomes("host_reject")
    assert o0.startswith("InvalidArgumentError"), o0
    assert "num_tokens 33 exceeds max_num_inp_token_per_rank 32" in o0
    assert o1.startswith("CUDA error"), o1
    assert "dispatch rejected by rank 0" in out1


def test_absent_peer_traps_after_the_timeout():
    (o0, out0), (o1, _) = _outcomes("absent_peer")
    assert o0.startswith("CUDA error"), o0
    assert float(re.search(r"after ([0-9.]+)s", o0).group(1)) < 30
    assert "timed out" in out0
    assert o1 == "stayed away"
