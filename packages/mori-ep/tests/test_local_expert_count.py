# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""ROCm/mori's raw config (``mori.cpp.EpDispatchCombineConfig``) and raw local expert
count launcher (``mori.ops.local_expert_count.launch_local_expert_count``) on host
memory: MORI's keyword constructor and defaults, its capacity rule, its counts and its
errors. The device kernel: test_local_expert_count_gpu.py."""

import random

import pytest
import torch

import mori
import mori.core as mc
from mori.ep import EpDispatchCombineConfig, EpDispatchCombineKernelType, EpDispatchCombineQuantType
from mori.ops.local_expert_count import launch_local_expert_count

RawConfig = mori.cpp.EpDispatchCombineConfig

# MORI's binding: field -> default, in constructor order.
MORI_RAW_DEFAULTS = {
    "rank": 0,
    "world_size": 0,
    "hidden_dim": 0,
    "scale_dim": 0,
    "scale_type_size": 0,
    "max_token_type_size": 0,
    "max_num_inp_token_per_rank": 0,
    "num_experts_per_rank": 0,
    "num_experts_per_token": 0,
    "max_total_recv_tokens": 0,
    "warp_num_per_block": 0,
    "block_num": 0,
    "use_external_inp_buf": True,
    "kernel_type": EpDispatchCombineKernelType.IntraNode,
    "gpu_per_node": 8,
    "rdma_block_num": 0,
    "num_qp_per_pe": 1,
    "quant_type": EpDispatchCombineQuantType.None_,
}


def _config(**kw):
    base = dict(rank=1, world_size=4, num_experts_per_rank=3, num_experts_per_token=2,
                warp_num_per_block=2, block_num=4)  # fmt: skip
    base.update(kw)
    return RawConfig(**base)


def _count(config, indices, total, *, fill=-1, **launch):
    """Launch on host tensors; returns the output as a list."""
    idx = torch.tensor(indices, dtype=torch.int32).reshape(-1, config.num_experts_per_token)
    tot = torch.tensor([total], dtype=torch.int32)
    out = torch.full((config.num_experts_per_rank,), fill, dtype=torch.int32)
    launch_local_expert_count(config, idx.data_ptr(), tot.data_ptr(), out.data_ptr(), **launch)
    return out.tolist()


def _reference(config, indices, total):
    lo = config.rank * config.num_experts_per_rank
    want = [0] * config.num_experts_per_rank
    for row in list(indices)[: max(total, 0)]:
        for e in row:
            if lo <= int(e) < lo + config.num_experts_per_rank:
                want[int(e) - lo] += 1
    return want


def test_raw_config_is_one_type_with_moris_keyword_constructor_and_defaults():
    import mori.ep._C

    assert RawConfig is mori.ep._C.EpDispatchCombineConfig
    from mori.cpp import EpDispatchCombineConfig as Again

    assert Again is RawConfig
    c = RawConfig()
    assert {f: getattr(c, f) for f in MORI_RAW_DEFAULTS} == MORI_RAW_DEFAULTS
    assert isinstance(c.kernel_type, EpDispatchCombineKernelType)
    # Every field by keyword, then written back.
    values = {f: (7 + i if isinstance(v, int) and not isinstance(v, bool) else v)
              for i, (f, v) in enumerate(MORI_RAW_DEFAULTS.items())}  # fmt: skip
    values["kernel_type"] = EpDispatchCombineKernelType.AsyncLL
    values["quant_type"] = EpDispatchCombineQuantType.Fp8DirectCast
    values["use_external_inp_buf"] = False
    c = RawConfig(**values)
    assert {f: getattr(c, f) for f in values} == values
    c.block_num, c.kernel_type, c.quant_type = 3, 5, EpDispatchCombineQuantType.None_
    assert (c.block_num, c.kernel_type, c.quant_type) == (3, EpDispatchCombineKernelType.IntraNodeLL,
                                                         EpDispatchCombineQuantType.None_)  # fmt: skip
    assert "kernel_type=EpDispatchCombineKernelType.IntraNodeLL" in repr(c)
    assert RawConfig.__doc__ and "mori.cpp.EpDispatchCombineConfig" in RawConfig.__doc__


def test_raw_config_refuses_kernel_and_quant_values_moris_enums_lack():
    with pytest.raises(mc.InvalidArgumentError, match="kernel_type 6 is not"):
        RawConfig(kernel_type=6)
    c = RawConfig()
    with pytest.raises(mc.InvalidArgumentError, match="quant_type -1 is not"):
        c.quant_type = -1
    assert c.quant_type == EpDispatchCombineQuantType.None_


@pytest.mark.parametrize(
    ("cap", "per_rank"), [(0, 16), (10, 3), (11, 3), (12, 3), (13, 4), (64, 16), (10**6, 16)]
)
def test_raw_config_capacity_follows_moris_rule_as_the_dataclass_does(cap, per_rank):
    raw = RawConfig(world_size=4, max_num_inp_token_per_rank=16, max_total_recv_tokens=cap)
    dc = EpDispatchCombineConfig(torch.bfloat16, 0, 4, 64, 0, 4, 2, 16, 2, 2,
                                 max_total_recv_tokens=cap)  # fmt: skip
    got = (raw.max_num_tokens_to_recv_per_rank(), raw.max_num_tokens_to_recv())
    assert got == (per_rank, 4 * per_rank)
    assert got == (dc.max_num_tokens_to_recv_per_rank, dc.max_num_tokens_to_recv)
    assert (raw.max_num_tokens_to_send_per_rank(), raw.max_num_tokens_to_send()) == (16, 64)


def test_dataclass_converts_to_the_raw_config():
    dc = EpDispatchCombineConfig(
        torch.bfloat16, 2, 4, 256, 2, 4, 2, 16, 8, 4, 4, 12, 40,
        kernel_type=EpDispatchCombineKernelType.AsyncLL, quant_type="fp8_direct_cast",
    )  # fmt: skip
    raw = dc.to_cpp_config()
    assert isinstance(raw, RawConfig)
    for f in MORI_RAW_DEFAULTS:
        want = dc.quant if f == "quant_type" else getattr(dc, f)
        assert getattr(raw, f) == want, f
    assert raw.max_num_tokens_to_recv() == dc.max_num_tokens_to_recv == 40


# MORI's cases (tests/python/ops/test_local_expert_count.py), on host memory.
MORI_CASES = [
    (dict(rank=1, world_size=4, num_experts_per_rank=3, num_experts_per_token=2),
     [[3, 0], [5, 4], [3, 5], [1, 5]], 4, [2, 1, 3]),
    (dict(rank=2, world_size=4, num_experts_per_rank=4, num_experts_per_token=1),
     [[8], [11], [9], [10]], 4, [1, 1, 1, 1]),
    (dict(rank=1, world_size=4, num_experts_per_rank=3, num_experts_per_token=2),
     [[0, 1], [2, 8], [7, 11]], 3, [0, 0, 0]),
    (dict(rank=0, world_size=2, num_experts_per_rank=4, num_experts_per_token=4),
     [[1, 1, 1, 1], [0, 2, 2, 5]], 2, [1, 4, 2, 0]),
    (dict(rank=1, world_size=4, num_experts_per_rank=2, num_experts_per_token=2),
     [[2, 3], [3, 4], [2, 0]], 2, [1, 2]),
    (dict(rank=1, world_size=4, num_experts_per_rank=4, num_experts_per_token=8),
     [[4, 5, 6, 7, 0, 1, 2, 3], [7, 6, 5, 4, 9, 10, 11, 12]], 2, [2, 2, 2, 2]),
]  # fmt: skip


@pytest.mark.parametrize(("kw", "indices", "total", "want"), MORI_CASES)
def test_moris_cases_on_host_memory(kw, indices, total, want):
    c = _config(**kw)
    assert _reference(c, indices, total) == want
    assert _count(c, indices, total) == want


def test_random_counts_equal_the_reference_and_overwrite_garbage():
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    gen = torch.Generator().manual_seed(seed)
    for trial in range(40):
        world = int(torch.randint(1, 9, (1,), generator=gen))
        epr = int(torch.randint(1, 40, (1,), generator=gen))
        k = int(torch.randint(1, 10, (1,), generator=gen))
        rank = int(torch.randint(0, world, (1,), generator=gen))
        rows = int(torch.randint(1, 64, (1,), generator=gen))  # an empty tensor has address 0
        # ids of every rank's experts, -1, and ids past the last expert
        idx = torch.randint(-1, world * epr + 3, (rows, k), generator=gen, dtype=torch.int32)
        total = int(torch.randint(-2, rows + 1, (1,), generator=gen))  # <= rows, may be <= 0
        c = _config(rank=rank, world_size=world, num_experts_per_rank=epr, num_experts_per_token=k)
        fill = int(torch.randint(-(2**31), 2**31 - 1, (1,), generator=gen))
        got = _count(c, idx.tolist(), total, fill=fill)
        assert got == _reference(c, idx.tolist(), total), (trial, world, epr, k, rank, total)


def test_the_dataclass_config_is_accepted_and_launch_overrides_are_moris():
    dc = EpDispatchCombineConfig(torch.bfloat16, 1, 4, 64, 0, 4, 2, 16, 3, 2)
    idx, want = [[3, 0], [5, 4], [3, 5], [1, 5]], [2, 1, 3]
    assert _count(dc.to_cpp_config(), idx, 4) == want
    idx_t = torch.tensor(idx, dtype=torch.int32)
    tot, out = torch.tensor([4], dtype=torch.int32), torch.full((3,), 9, dtype=torch.int32)
    launch_local_expert_count(dc, idx_t.data_ptr(), tot.data_ptr(), out.data_ptr())
    assert out.tolist() == want
    # A config of zeros runs with positive overrides (MORI: <= 0 takes the config's).
    c = _config(warp_num_per_block=0, block_num=0)
    assert _count(c, idx, 4, block_num=3, warp_per_block=2) == want


@pytest.mark.parametrize(
    ("cfg", "launch"),
    [({"warp_num_per_block": 0, "block_num": 0}, {}),
     ({"block_num": 0}, {}), ({"warp_num_per_block": -3}, {"block_num": 5}),
     ({"warp_num_per_block": 0}, {"warp_per_block": -1})],
)  # fmt: skip
def test_non_positive_launch_settings_raise_moris_runtime_error(cfg, launch):
    with pytest.raises(RuntimeError, match="positive block and warp settings"):
        _count(_config(**cfg), [[3, 4]], 1, **launch)


def test_other_bad_arguments_name_the_value():
    c = _config()
    idx = torch.tensor([[3, 4]], dtype=torch.int32)
    tot, out = torch.tensor([1], dtype=torch.int32), torch.full((3,), 5, dtype=torch.int32)
    ptrs = (idx.data_ptr(), tot.data_ptr(), out.data_ptr())
    with pytest.raises(mc.InvalidArgumentError, match="warp_per_block 33 exceeds 32"):
        launch_local_expert_count(c, *ptrs, warp_per_block=33)
    with pytest.raises(mc.InvalidArgumentError, match="requires non-null indices"):
        launch_local_expert_count(c, idx.data_ptr(), 0, out.data_ptr())
    with pytest.raises(mc.InvalidArgumentError, match="num_experts_per_rank 0 must be >= 1"):
        launch_local_expert_count(_config(num_experts_per_rank=0), *ptrs)
    with pytest.raises(mc.InvalidArgumentError, match="rank -1 must be >= 0"):
        launch_local_expert_count(_config(rank=-1), *ptrs)
    with pytest.raises(mc.InvalidArgumentError, match="indices_ptr must be an address"):
        launch_local_expert_count(c, idx, *ptrs[1:])
    with pytest.raises(mc.InvalidArgumentError, match="stream must be an address"):
        launch_local_expert_count(c, *ptrs, stream=-1)
    with pytest.raises(mc.InvalidArgumentError, match="config must be a mori.cpp"):
        launch_local_expert_count({"rank": 1}, *ptrs)
    assert out.tolist() == [5, 5, 5]  # a refused call writes nothing


def test_mori_cpp_names_resolve_to_mori_ep():
    import mori.cpp
    import mori.ep.local_expert_count as lec

    assert mori.cpp.launch_local_expert_count is lec.launch_local_expert_count
    assert launch_local_expert_count is lec.launch_local_expert_count
    from mori.ops import launch_local_expert_count as top_level  # MORI exports it there too

    assert top_level is lec.launch_local_expert_count
    assert {"EpDispatchCombineConfig", "launch_local_expert_count"} <= set(mori.cpp.__all__)
