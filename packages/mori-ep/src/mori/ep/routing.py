# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""MORI's routing handles: a snapshot of one intra-node dispatch's routing.

``dispatch(..., return_routing=True)`` returns an :class:`EpDispatchRoutingHandle`
beside its outputs; ``combine(..., routing=handle)`` reverses that dispatch instead of
the op's last one (several micro-batches can be dispatched before the first is
combined), and ``dispatch(..., routing=handle)`` replays its layout: every token goes
to the ranks it went to then, whatever ``indices`` now say (they travel as data), so
the rows land where they landed then. How the snapshot maps onto the protocol's
regions (``csrc/protocol.hpp``) is said at :class:`EpDispatchRoutingHandle`; the
rest of the protocol's state a combine needs is derived from it here, with torch
operations on the op's device (no host synchronisation). The functions take the op's
:class:`~mori.ep.intranode.IntraNodeMode` (``mode``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ._C import ep_combine_group_tokens


@dataclass
class EpDispatchRoutingHandle:
    """The routing of one dispatch, replayed by ``dispatch(..., routing=)`` and reversed
    by ``combine(..., routing=)`` (MORI's class: its fields, order and
    :meth:`tensors` / :meth:`from_tensors`). int32 tensors on the op's device, with
    W = world_size, M = max_num_inp_token_per_rank, C = max_num_tokens_to_recv():

    Attributes:
        disp_dest_tok_id_map: ``[M * W]``, entry ``t * W + d`` is 1 when this rank's
            token ``t`` went to rank ``d``; any other value (0, or MORI's -1) reads
            as not sent, as does 1 at this rank for a token with no row here. (MORI
            stores each token's destination slot; here a slot follows from the
            destination sets of every rank, which the protocol's count exchange
            recomputes, so the sets are what is kept.)
        inter_node_disp_dest_tok_id_map, inter_node_disp_send_map: empty (MORI's
            inter-node maps; intra-node only here, as in MORI's own intra-node op).
        total_recv_token_num: ``[1]`` rows this rank received (dispatch's
            ``total_recv``).
        disp_tok_id_to_src_tok_id_local: ``[C]``, received row ``i`` came from rank
            ``v // M``, its token ``v % M`` (``v = src_rank * M + token``; -1 past
            ``total_recv``).
        cur_rank_num_token: tokens this rank dispatched in that call.

    A handle is tied to the op whose dispatch made or last replayed it; combines
    take handles in the order of those dispatches, once each.
    """

    disp_dest_tok_id_map: torch.Tensor
    inter_node_disp_dest_tok_id_map: torch.Tensor
    inter_node_disp_send_map: torch.Tensor
    total_recv_token_num: torch.Tensor
    disp_tok_id_to_src_tok_id_local: torch.Tensor
    cur_rank_num_token: int = 0
    # Set by the dispatch that made or replayed the handle: the op's token, the
    # dispatch's epoch (host int; an int64 [1] tensor on the op's device, which on
    # CUDA is read by the combine kernel) and the derived combine state.
    _owner: Any = field(default=None, init=False, repr=False, compare=False)
    _epoch: int = field(default=0, init=False, repr=False, compare=False)
    _epoch_dev: Any = field(default=None, init=False, repr=False, compare=False)
    _derived: Any = field(default=None, init=False, repr=False, compare=False)

    def tensors(self):
        """MORI's five tensors, in field order."""
        return (
            self.disp_dest_tok_id_map,
            self.inter_node_disp_dest_tok_id_map,
            self.inter_node_disp_send_map,
            self.total_recv_token_num,
            self.disp_tok_id_to_src_tok_id_local,
        )

    @classmethod
    def from_tensors(cls, tensors, cur_rank_num_token=0):
        """A handle of :meth:`tensors`' five tensors (MORI's). It can be replayed
        (``dispatch(..., routing=)``), after which it can be combined."""
        return cls(*tensors, cur_rank_num_token=cur_rank_num_token)


def handle_problem(h, mode, replay: bool) -> str | None:
    """Why ``h`` cannot serve a dispatch replay (``replay``) or a combine on the op,
    or None: type, dtypes, sizes and devices against the op's shape."""
    if not isinstance(h, EpDispatchRoutingHandle):
        return f"routing must be an EpDispatchRoutingHandle, got {type(h).__name__}"
    c = mode.config
    m, w, cap = c.max_num_inp_token_per_rank, c.world_size, c.max_num_tokens_to_recv
    for name, want in (
        ("disp_dest_tok_id_map", m * w),
        ("total_recv_token_num", 1),
        ("disp_tok_id_to_src_tok_id_local", cap),
    ):
        t = getattr(h, name)
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.numel() != want:
            return (
                f"routing handle's {name} must be an int32 tensor of {want} elements for this "
                f"op (world_size {w}, max_num_inp_token_per_rank {m}, receive capacity {cap}), "
                f"got {_what(t)}"
            )
        if t.device != mode.device:
            return f"routing handle's {name} is on {t.device}, the op runs on {mode.device}"
        if not t.is_contiguous():
            return f"routing handle's {name} must be contiguous"
    n = h.cur_rank_num_token
    if not isinstance(n, int) or n < 0 or n > m or (n == 0 and h._owner is None):
        return (
            f"routing handle has cur_rank_num_token {n!r}; use a handle from "
            "dispatch(..., return_routing=True) or pass a cur_rank_num_token in "
            f"[1, {m}] to EpDispatchRoutingHandle.from_tensors(...)"
        )
    if not replay and h._owner is not mode.routing_owner:
        return (
            "this routing handle was not made or replayed by a dispatch of this op; "
            "replay it first (dispatch(..., routing=handle))"
        )
    return None


def order_problem(h, mode) -> str | None:
    """Why combine may not reverse ``h`` on this op by the order rules alone (a
    local InvalidStateError: every rank sees the same order), or None."""
    if isinstance(h, EpDispatchRoutingHandle) and h._owner is not mode.routing_owner:
        return (
            "this routing handle was not made or replayed by a dispatch of this op; "
            "replay it first (dispatch(..., routing=handle))"
        )
    return None


def reject_words(mode, h) -> list[int] | None:
    """The routing a combine rejected for its arguments takes part as: the handle's
    epoch when it is this op's, else None (the last dispatch's, which is at least
    any handle's)."""
    if not isinstance(h, EpDispatchRoutingHandle) or h._owner is not mode.routing_owner:
        return None
    if h._epoch_dev is None or h._epoch_dev.device != mode.device:
        return None
    return [0, 0, 0, 0, 0, h._epoch_dev.data_ptr(), h._epoch, 0]


def _what(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"{t.dtype} tensor of {t.numel()} elements"
    return type(t).__name__


def snapshot(mode, num_tokens: int) -> EpDispatchRoutingHandle:
    """The routing of the op's dispatch that just ended (enqueued, on CUDA), as a new
    handle. Reads regions that only this rank's next dispatch rewrites (protocol.hpp),
    on the current stream."""
    c = mode.config
    m, w, cap = c.max_num_inp_token_per_rank, c.world_size, c.max_num_tokens_to_recv
    sent = mode.region("token_ranks", m * w).view(m, w).to(torch.int32)
    sent[num_tokens:] = 0  # rows past num_tokens hold an earlier dispatch's sets
    total = mode.total_recv.clone()
    rows = torch.arange(cap, dtype=torch.int32, device=mode.device)
    src = torch.where(rows < total, mode.recv_src_pos, -1)
    empty = torch.empty(0, dtype=torch.int32, device=mode.device)
    h = EpDispatchRoutingHandle(sent.flatten(), empty, empty.clone(), total, src, num_tokens)
    stamp(mode, h)
    return h


def stamp(mode, h: EpDispatchRoutingHandle) -> None:
    """Records that the op's dispatch that just ended made or replayed ``h``."""
    epoch = mode.epoch_tensor()
    if h._epoch_dev is None or h._epoch_dev.device != mode.device:
        h._epoch_dev = epoch.clone()
    else:
        h._epoch_dev.copy_(epoch)
    h._owner, h._epoch = mode.routing_owner, mode.impl.epoch


def rank_masks(mode, h: EpDispatchRoutingHandle) -> torch.Tensor:
    """int32 ``[M]``: bit d of entry t set when token t goes to rank d (a replay)."""
    return derived(mode, h)[4]


def derived(mode, h: EpDispatchRoutingHandle):
    """(src_pos, group_row, token_ranks, token_self_row, rank_masks, total_recv): the
    protocol's regions of the handle's dispatch (protocol.hpp), rebuilt from its
    tensors on the op's device. Any tensor contents give in-range values (entries
    that cannot come from a dispatch are dropped), so a foreign handle cannot make
    combine write outside its buffers."""
    if h._derived is not None and h._derived[0] is h.disp_tok_id_to_src_tok_id_local:
        return h._derived[1]
    c = mode.config
    m, w, cap, me = c.max_num_inp_token_per_rank, c.world_size, c.max_num_tokens_to_recv, c.rank
    g = -(-m // ep_combine_group_tokens)
    dev = mode.device
    # 1 is sent, anything else is not (MORI-ported maps may hold -1 for "not sent").
    sent = h.disp_dest_tok_id_map.view(m, w) == 1
    masks = (sent.to(torch.int32) << torch.arange(w, dtype=torch.int32, device=dev)).sum(
        1, dtype=torch.int32
    )
    rev = h.disp_tok_id_to_src_tok_id_local
    total = h.total_recv_token_num.clamp(0, cap)
    rows = torch.arange(cap, dtype=torch.int32, device=dev)
    valid = (rows < total) & (rev >= 0) & (rev < w * m)
    # Rows arrive ordered by (source rank, token): the first row of source s's token
    # group j is the first with a position >= s * M + 8j (its rows' end: (s + 1) * M).
    pos = torch.where(valid, rev, torch.iinfo(torch.int32).max)
    keys = torch.arange(w, device=dev)[:, None] * m + torch.arange(g + 1, device=dev) * (
        ep_combine_group_tokens
    )
    keys[:, g] = (torch.arange(w, device=dev) + 1) * m
    group_row = torch.searchsorted(pos, keys.flatten().to(torch.int32), out_int32=True)
    mine = valid & (rev // m == me)
    self_row = torch.full((m + 1,), -1, dtype=torch.int32, device=dev)
    self_row.scatter_(0, torch.where(mine, rev % m, m).long(), rows)
    # A token counts as sent to this rank only where a row of it came back, so that
    # combine never reads the row before the input (self_row -1).
    token_ranks = sent.to(torch.uint8).contiguous()
    token_ranks[:, me] &= (self_row[:m] >= 0).to(torch.uint8)
    src_pos = torch.where(valid, rev, me * m)  # an invalid row reads as this rank's own
    out = (src_pos, group_row.view(w, g + 1), token_ranks, self_row[:m].contiguous(), masks, total)
    h._derived = (rev, out)
    return out


def combine_words(mode, h: EpDispatchRoutingHandle) -> list[int]:
    """The handle as the native combine takes it (RoutingSnapshot in
    csrc/intranode_args.hpp)."""
    src_pos, group_row, token_ranks, self_row, _, total = derived(mode, h)
    return [
        src_pos.data_ptr(),
        group_row.data_ptr(),
        token_ranks.data_ptr(),
        self_row.data_ptr(),
        total.data_ptr(),
        h._epoch_dev.data_ptr(),
        h._epoch,
        h.cur_rank_num_token,
    ]
