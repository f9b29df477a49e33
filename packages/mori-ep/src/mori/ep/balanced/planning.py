# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The balanced mode's plan: :func:`plan` (no communication) and the :class:`Plan`
object ``Buffer.dispatch`` returns. The algorithm is stated in
``csrc/balanced/planner.hpp`` and in the README's "Balanced mode"."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mori.core import InvalidArgumentError

from .. import _C


def nvs_of(S: int, K: int, E: int, num_ep_ranks: int, token_padding: int) -> int:
    """NvS = align_up(S*K + (token_padding - 1) * 2 * epn, token_padding): a rank's
    slot count. Refuses (InvalidArgumentError naming the value) a shape the int32
    tables cannot encode."""
    return int(_C.balanced_nvs(num_ep_ranks, E, S, K, token_padding))


def _int(value, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgumentError(f"{name} {value!r} must be an int >= {minimum}")
    return value


@dataclass
class Plan:
    """One rank's plan (MoonEP's ``MoonEPCommPlan``): save it for ``prefetch_weight``,
    ``combine`` and both backward passes; ``dispatch(..., plan=plan)`` reuses it
    without planning. int32 CPU tensors:

    - ``dst`` [S*K]: pair (t, k) goes to slot ``dst % NvS`` of rank ``dst // NvS``;
      a later k of a token whose rank an earlier k already reaches is ``-dst - 1``.
    - ``cu_seqlens`` [2*epn]: padded end slot of each group (local experts, then the
      prefetch slots).
    - ``experts_to_copy`` [R, epn]: expert held in rank d's prefetch slot b, -1 none.
    - ``zero_fill_ranges`` [2*epn, 2]: (first pad slot, pad rows) of each group.
    - ``remote_stats`` [2]: (remote experts this rank holds, own experts held elsewhere).
    - ``dup_groups`` [NvS, 3], ``dup_loffs`` [NvS], ``dup_counts`` [2]: this rank's
      duplicate slots (primary slot, first index in dup_loffs, duplicates), in
      ascending primary slot; ``dup_counts`` = (groups, duplicate slots).
    - ``alloc`` [R, E], ``expert_offsets`` [R, E]: pairs of expert e placed on rank d,
      and their first slot there.
    """

    rank: int
    num_ep_ranks: int
    S: int
    K: int
    E: int
    token_padding: int
    nvs: int
    dst: torch.Tensor
    cu_seqlens: torch.Tensor
    experts_to_copy: torch.Tensor
    zero_fill_ranges: torch.Tensor
    remote_stats: torch.Tensor
    dup_groups: torch.Tensor
    dup_loffs: torch.Tensor
    dup_counts: torch.Tensor
    alloc: torch.Tensor
    expert_offsets: torch.Tensor

    @property
    def key(self) -> tuple:
        """The shape this plan was made for (a Buffer refuses another's plan)."""
        return (self.num_ep_ranks, self.E, self.S, self.K, self.token_padding)

    def rank_tables(self) -> list[int]:
        """Addresses in balanced_py.cpp's RankPlan order."""
        zf = self.zero_fill_ranges
        return [t.data_ptr() for t in (self.dst, self.experts_to_copy, zf, self.dup_groups,
                                       self.dup_loffs, self.dup_counts)]  # fmt: skip

    def received_rows(self) -> int:
        """Real (token, k) rows this rank receives: S*K for every rank of a plan."""
        return int(self.alloc[self.rank].sum())


@dataclass
class PlanSet:
    """Every rank's tables of one plan (:func:`plan`). ``[R, ...]`` int32 tensors named
    as :class:`Plan`'s; ``dst`` [R, S*K] and the duplicate tables only when ``topk``
    was given. ``for_rank(r)`` is rank r's :class:`Plan`."""

    num_ep_ranks: int
    S: int
    K: int
    E: int
    token_padding: int
    nvs: int
    alloc: torch.Tensor
    expert_offsets: torch.Tensor
    cu_seqlens: torch.Tensor
    zero_fill_ranges: torch.Tensor
    experts_to_copy: torch.Tensor
    remote_stats: torch.Tensor
    dst: torch.Tensor | None = None
    dup_groups: torch.Tensor | None = None
    dup_loffs: torch.Tensor | None = None
    dup_counts: torch.Tensor | None = None
    dup_src: torch.Tensor | None = field(default=None, repr=False)

    def for_rank(self, rank: int) -> Plan:
        if self.dst is None:
            raise InvalidArgumentError("for_rank needs a plan made with topk")
        if not 0 <= rank < self.num_ep_ranks:
            raise InvalidArgumentError(f"rank {rank} out of range [0, {self.num_ep_ranks})")
        return Plan(
            rank, self.num_ep_ranks, self.S, self.K, self.E, self.token_padding, self.nvs,
            self.dst[rank].clone(), self.cu_seqlens[rank].clone(), self.experts_to_copy.clone(),
            self.zero_fill_ranges[rank].clone(), self.remote_stats[rank].clone(),
            self.dup_groups[rank].clone(), self.dup_loffs[rank].clone(),
            self.dup_counts[rank].clone(), self.alloc.clone(), self.expert_offsets.clone(),
        )  # fmt: skip


def empty_tables(R: int, E: int, device=None) -> dict[str, torch.Tensor]:
    """Uninitialised [R, ...] tables for the planner (names as PlanSet's), on ``device``
    (default the CPU): allocated there, no copy, no synchronisation."""
    epn = E // R
    i32 = dict(dtype=torch.int32, device=device)
    return {
        "alloc": torch.empty(R, E, **i32),
        "expert_offsets": torch.empty(R, E, **i32),
        "cu_seqlens": torch.empty(R, 2 * epn, **i32),
        "zero_fill_ranges": torch.empty(R, 2 * epn, 2, **i32),
        "experts_to_copy": torch.empty(R, epn, **i32),
        "remote_stats": torch.empty(R, 2, **i32),
    }


def table_addresses(t: dict[str, torch.Tensor]) -> list[int]:
    """Addresses in balanced_py.cpp's PlanTables order."""
    names = ("alloc", "expert_offsets", "cu_seqlens", "zero_fill_ranges", "experts_to_copy",
             "remote_stats")  # fmt: skip
    return [t[n].data_ptr() for n in names]


def _int_tensor(x, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise InvalidArgumentError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.int32, torch.int64, torch.int16, torch.uint8, torch.int8):
        raise InvalidArgumentError(f"{name} dtype {x.dtype} must be an integer dtype")
    if tuple(x.shape) != shape:
        raise InvalidArgumentError(f"{name} shape {tuple(x.shape)} must be {shape}")
    if x.dtype == torch.int64 and x.numel() and (x.max() >= 2**31 or x.min() < -(2**31)):
        raise InvalidArgumentError(f"{name} holds values beyond int32")
    return x.detach().to("cpu", torch.int32).contiguous()


def plan(tpe, S: int, K: int, token_padding: int = 128, topk=None) -> PlanSet:
    """Plan every rank's tables from the counts alone, without communication (for tests
    and simulation; ``Buffer.dispatch`` plans the same way from gathered counts).

    Args:
        tpe: [R, E] integer tensor, tpe[r, e] = pairs of rank r routed to expert e;
            every row sums to S*K.
        S, K: tokens per rank and top-k.
        token_padding: each non-empty group is padded to a multiple of this.
        topk: optional [R, S, K] integer expert ids whose counts are ``tpe``; with it
            the result holds every rank's ``dst`` and duplicate tables.

    Returns:
        PlanSet. Raises InvalidArgumentError naming the value for a bad shape, a
        negative count, a row not summing to S*K, an expert id out of range or counts
        that differ from ``tpe``.
    """
    S, K = _int(S, "S"), _int(K, "K")
    token_padding = _int(token_padding, "token_padding")
    if not isinstance(tpe, torch.Tensor) or tpe.dim() != 2:
        raise InvalidArgumentError(
            f"tpe must be a [R, E] tensor, got {getattr(tpe, 'shape', type(tpe).__name__)}"
        )
    R, E = int(tpe.shape[0]), int(tpe.shape[1])
    counts = _int_tensor(tpe, "tpe", (R, E))
    nvs = nvs_of(S, K, E, R, token_padding)
    tables = empty_tables(R, E)
    _C.balanced_plan_tables_cpu(R, E, S, K, token_padding, counts.data_ptr(),
                                table_addresses(tables))  # fmt: skip
    out = PlanSet(R, S, K, E, token_padding, nvs, **tables)
    if topk is None:
        return out
    ids = _int_tensor(topk, "topk", (R, S, K))
    dst = torch.empty(R, S * K, dtype=torch.int32)
    for r in range(R):
        _C.balanced_plan_destinations_cpu(R, E, S, K, token_padding, counts.data_ptr(),
                                          table_addresses(tables), r, ids[r].data_ptr(),
                                          dst[r].data_ptr())  # fmt: skip
    out.dst = dst
    out.dup_src = torch.empty(R, nvs, dtype=torch.int32)
    out.dup_groups = torch.zeros(R, nvs, 3, dtype=torch.int32)
    out.dup_loffs = torch.zeros(R, nvs, dtype=torch.int32)
    out.dup_counts = torch.zeros(R, 2, dtype=torch.int32)
    for d in range(R):
        _C.balanced_duplicate_tables_cpu(
            R, E, S, K, token_padding, dst.data_ptr(), d, out.dup_src[d].data_ptr(),
            out.dup_groups[d].data_ptr(), out.dup_loffs[d].data_ptr(),
            out.dup_counts[d].data_ptr(),
        )  # fmt: skip
    return out


_PLANNER_ERRORS = {
    1: "tokens_per_expert of rank {0} sums to (or holds) {1}, expected S*K",
    2: "expert id {1} out of range at pair {0}",
    3: "tokens_per_expert[{0}] differs from topk_experts by {1} pairs",
    4: "planner invariant broken at rank {0} ({1})",
    5: "planner chunk {0} waited too long for chunk {1}",
}


def plan_cuda(tpe, topk, rank: int, S: int, K: int, token_padding: int = 128, *,
              check: bool = True) -> tuple[PlanSet, torch.Tensor]:  # fmt: skip
    """The CUDA planner (one launch on the current stream; needs a CUDA build).

    Args:
        tpe: [R, E] int32 CUDA tensor, every rank's counts (gathered).
        topk: [S, K] int32 CUDA tensor, this rank's expert ids.
        rank: this rank.
        check: synchronize and raise InvalidArgumentError naming the value when the
            kernel's error record is set (False: return without synchronizing).

    Returns:
        (PlanSet with every rank's tables and this rank's ``dst`` [1, S*K] as CUDA
        tensors, the kernel's error record [4] int32).
    """
    if not getattr(_C, "with_cuda", False):
        from mori.core import NotSupportedError

        raise NotSupportedError("plan_cuda needs mori.ep built with CUDA")
    S, K = _int(S, "S"), _int(K, "K")
    token_padding = _int(token_padding, "token_padding")
    R, E = int(tpe.shape[0]), int(tpe.shape[1])
    for name, x, shape in (("tpe", tpe, (R, E)), ("topk", topk, (S, K))):
        if x.dtype != torch.int32 or not x.is_cuda or not x.is_contiguous():
            raise InvalidArgumentError(f"{name} must be a contiguous int32 CUDA tensor")
        if tuple(x.shape) != shape:
            raise InvalidArgumentError(f"{name} shape {tuple(x.shape)} must be {shape}")
    nvs = nvs_of(S, K, E, R, token_padding)
    dev = tpe.device
    tables = empty_tables(R, E, dev)
    dst = torch.empty(1, S * K, dtype=torch.int32, device=dev)
    error = torch.empty(4, dtype=torch.int32, device=dev)
    words = _C.balanced_planner_scratch_words(R, E, S, K, token_padding)
    scratch = torch.empty(words, dtype=torch.int32, device=dev)
    stream = torch.cuda.current_stream(dev).cuda_stream
    _C.balanced_plan_cuda(R, E, S, K, token_padding, tpe.data_ptr(), topk.data_ptr(), int(rank),
                          table_addresses(tables), dst.data_ptr(), error.data_ptr(),
                          scratch.data_ptr(), stream)  # fmt: skip
    out = PlanSet(R, S, K, E, token_padding, nvs, **tables)
    out.dst = dst
    if check:
        code, a, b, _ = error.tolist()
        if code:
            raise InvalidArgumentError(
                "CUDA planner: " + _PLANNER_ERRORS.get(code, "error {0} {1}").format(a, b)
            )
    return out, error
