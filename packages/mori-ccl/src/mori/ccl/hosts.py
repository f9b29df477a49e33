# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Collectives of a group that spans hosts: the part within each host runs on mori's
symmetric heap (a Communicator over the host's pes), the part between hosts through
the group's own torch.distributed backend (NCCL on GPUs, gloo on CPUs).

Ranks are laid out as ``H`` hosts of ``L`` ranks each (every host must have the same
number); host h is the h-th host ordered by its lowest rank, local rank i its i-th
rank in ascending order. Local rank i of every host forms the inter-host group i.

- all_reduce: reduce-scatter within the host (local rank i holds shard i of the host's
  sum), all-gather of the shard across hosts and its reduction in host order, then
  all-gather within the host. Every rank reduces the same values in the same order, so
  every rank ends bit-identical: for bf16/fp16 each host's sum is rounded once, then
  the hosts' sums are accumulated in fp32 in host order and rounded once more.
- all_gather: within the host, then across hosts, placed in rank order.
- reduce_scatter: within the host on x permuted so that local rank i receives the
  host's partial sums of the blocks of ranks (h, i) for every host h; an all-to-all of
  those across hosts; their reduction in host order.
- all_to_all: rows for ranks of the same host through mori, rows for other hosts
  through the backend's all_to_all_single over the whole group.
- broadcast: within every host from the source's local rank, then across hosts within
  each inter-host group from the source's host.

Failures. The host's part detects mismatches and rejected inputs among the host's
ranks as a Communicator does. On host heaps every call then exchanges its descriptor
(collective, size, dtype, op, algorithm, source, splits, whether the host's part
failed) among all ranks through the backend before any data crosses hosts, so calls
that differ across hosts and a rank's rejected input fail the call on every rank with
InvalidArgumentError, and all-to-all splits are checked pair by pair. On CUDA heaps
this exchange would synchronise with the host each call, so it is not made: calls
that differ across hosts are the backend's to detect (NCCL may hang on them).
"""

from __future__ import annotations

import datetime
from typing import Any

import torch

from mori.core import InvalidArgumentError, MoriTimeoutError, NotSupportedError

_KINDS = ("barrier", "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
_DTYPE_CODES = (torch.float32, torch.bfloat16, torch.float16, torch.int32)
_OP_CODES = ("sum", "max", "min")
_ALGO_CODES = ("auto", "one_shot", "two_shot", "one_shot_ll", "sm", "copy_engine")
# Descriptor words: failed, kind, dtype, bytes, op, algorithm, root, row_bytes, then
# in_splits [W] and out_splits [W] (all-to-all).
_FIXED = 8


def _gather_ints(values: list[int], group, device) -> torch.Tensor:
    """[group size, len(values)] int64 on the CPU: every rank's values, in rank order."""
    import torch.distributed as dist

    mine = torch.tensor(values, dtype=torch.int64, device=device)
    n = dist.get_world_size(group)
    out = torch.empty(n * len(values), dtype=torch.int64, device=device)  # flat for gloo
    dist.all_gather_into_tensor(out, mine, group=group)
    return out.view(n, len(values)).cpu()


def _reduce_hosts(parts: torch.Tensor, op: str) -> torch.Tensor:
    """op over dim 0 of ``parts`` ([H, m]) in index order: bf16/fp16 accumulate in fp32
    and round once; fp32 and int32 in their own type."""
    if op == "max":
        return parts.amax(0)
    if op == "min":
        return parts.amin(0)
    wide = parts.dtype in (torch.bfloat16, torch.float16)
    acc = parts[0].float() if wide else parts[0].clone()
    for h in range(1, parts.shape[0]):
        acc += parts[h].float() if wide else parts[h]
    return acc.to(parts.dtype) if wide else acc


class SpanningHosts:
    """The collectives of ``comm`` (a Communicator whose heap spans hosts) as a host
    part on ``comm.local`` and an inter-host part through ``group``'s backend. Built
    by Communicator; collective."""

    def __init__(self, comm, group: Any, local_pes: list[int]):
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise NotSupportedError(
                "a heap that spans hosts needs torch.distributed for the part between hosts"
            )
        self.comm = comm
        self.group = group
        W, me = comm.world_size, comm.rank
        self.backend = str(dist.get_backend(group))
        # NCCL moves device tensors; gloo is given CPU copies (of CUDA tensors too).
        self.wire = comm.device if self.backend == "nccl" else torch.device("cpu")
        mask = [0] * W
        for pe in local_pes:
            mask[pe] = 1
        masks = _gather_ints(mask, group, self.wire).tolist()
        hosts: list[list[int]] = []
        for r in range(W):
            pes = [p for p in range(W) if masks[r][p]]
            if pes not in hosts:
                hosts.append(pes)
        hosts.sort()
        sizes = sorted({len(h) for h in hosts})
        if len(sizes) != 1 or any(masks[r][r] != 1 for r in range(W)):
            raise NotSupportedError(
                f"the group's hosts hold {[len(h) for h in hosts]} ranks: spanning hosts "
                "needs the same number of ranks on every host"
            )
        self.hosts = hosts
        self.H, self.L = len(hosts), sizes[0]
        self.host_of = [0] * W
        self.local_of = [0] * W
        for h, pes in enumerate(hosts):
            for i, p in enumerate(pes):
                self.host_of[p], self.local_of[p] = h, i
        self.host, self.local_rank = self.host_of[me], self.local_of[me]
        # all_gather: output row r = gathered row host_of[r] * L + local_of[r].
        self.gather_order = torch.tensor(
            [self.host_of[r] * self.L + self.local_of[r] for r in range(W)], device=comm.device
        )
        # reduce_scatter: local rank i gets blocks of ranks (h, i), h ascending.
        self.scatter_order = torch.tensor(
            [hosts[h][i] for i in range(self.L) for h in range(self.H)], device=comm.device
        )

        def global_rank(r: int) -> int:
            return r if group is None else dist.get_global_rank(group, r)

        # Groups of their own, so that their waits are bounded by the communicator's
        # timeout; every rank creates every group, in the same order.
        timeout = datetime.timedelta(seconds=comm.timeout_s)
        self.inter = None
        for i in range(self.L):
            g = dist.new_group(
                [global_rank(hosts[h][i]) for h in range(self.H)],
                backend=self.backend,
                timeout=timeout,
            )
            if i == self.local_rank:
                self.inter = g
        self.everyone = dist.new_group(
            [global_rank(r) for r in range(W)], backend=self.backend, timeout=timeout
        )
        self.check = not comm.cuda
        self.calls = 0

    # ------------------------------------------------------------ agreement
    def _describe(self, d: list[int]) -> str:
        kind = _KINDS[d[1]]
        if kind == "barrier":
            return kind
        s = f"{kind} of {d[3]} bytes of {str(_DTYPE_CODES[d[2]]).removeprefix('torch.')}"
        if d[4] >= 0:
            s += f", op {_OP_CODES[d[4]]}"
        if d[5] >= 0:
            s += f", {_ALGO_CODES[d[5]]}"
        if d[6] >= 0:
            s += f", src {d[6]}"
        if kind == "all_to_all":
            s += f", {d[7]}-byte rows"
        return s

    def _step(self, desc: list[int], host_part, *, splits=None):
        """Runs the host's part, then (host heaps) every rank's descriptor is compared
        before anything crosses hosts; raises on every rank alike."""
        self.comm._impl_or_raise()
        self.calls += 1
        failure = None
        result = None
        try:
            result = host_part()
        except (InvalidArgumentError, MoriTimeoutError) as e:
            failure = e
            if isinstance(e, MoriTimeoutError):
                self.comm._timed_out = str(e).splitlines()[0]
        if not self.check:
            if failure is not None:
                raise failure
            return result
        W = self.comm.world_size
        ins, outs = splits if splits is not None else ([0] * W, [0] * W)
        code = 0 if failure is None else 2 if isinstance(failure, MoriTimeoutError) else 1
        words = [code, *desc[1:], *ins, *outs]
        table = _gather_ints(words, self.everyone, self.wire).tolist()
        if failure is not None:
            raise failure
        where = f"call {self.calls} across hosts"
        failed = [r for r in range(W) if table[r][0]]
        if failed:
            r = failed[0]
            text = (
                f"{_KINDS[desc[1]]} ({where}) on rank {self.comm.rank}: the call failed on the "
                f"host of rank {r} (rank {r}'s message says why)"
            )
            if table[r][0] == 2:
                self.comm._timed_out = text
                raise MoriTimeoutError(text)
            raise InvalidArgumentError(text)
        for r in range(W):
            a, b = table[self.comm.rank][1:_FIXED], table[r][1:_FIXED]
            if _KINDS[a[0]] == "all_to_all" and _KINDS[b[0]] == "all_to_all":
                a, b = a[:2] + a[3:], b[:2] + b[3:]  # sizes differ in all-to-all-v
            if a != b:
                raise InvalidArgumentError(
                    f"ranks disagree ({where}): rank {self.comm.rank} calls "
                    f"{self._describe(table[self.comm.rank])}, rank {r} calls "
                    f"{self._describe(table[r])}"
                )
        if splits is not None:
            for s in range(W):
                for d in range(W):
                    sent, wanted = table[s][_FIXED + d], table[d][_FIXED + W + s]
                    if sent != wanted:
                        raise InvalidArgumentError(
                            f"all_to_all ({where}): rank {s} sends {sent} rows to rank {d}, "
                            f"which expects {wanted} rows from it"
                        )
        return result

    def _desc(self, kind, x=None, op=None, algorithm=None, root=-1, row_bytes=0) -> list[int]:
        ok = isinstance(x, torch.Tensor) and x.dtype in _DTYPE_CODES
        return [
            0,
            _KINDS.index(kind),
            _DTYPE_CODES.index(x.dtype) if ok else 0,
            x.numel() * x.element_size() if ok else 0,
            _OP_CODES.index(op) if op in _OP_CODES else -1,
            _ALGO_CODES.index(algorithm) if algorithm in _ALGO_CODES else -1,
            root,
            row_bytes,
        ]

    def _reject(self, kind: str, problem: str):
        """The host's part of a call whose input failed validation here: the host's
        other ranks fail that call too, naming this rank."""
        self.comm.local._reject(kind, problem)

    # ---------------------------------------------------------- wire helpers
    def _on_wire(self, t: torch.Tensor) -> torch.Tensor:
        return t if t.device == self.wire else t.to(self.wire)

    def _inter_all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """[H, t.numel()] (on the communicator's device): every host's t, host order."""
        import torch.distributed as dist

        src = self._on_wire(t.reshape(-1).contiguous())
        out = torch.empty(self.H * src.numel(), dtype=t.dtype, device=self.wire)  # flat for gloo
        dist.all_gather_into_tensor(out, src, group=self.inter)
        return out.view(self.H, src.numel()).to(self.comm.device)

    # ------------------------------------------------------------ collectives
    def all_reduce(self, x, op, out, algorithm, max_blocks, problem):
        c = self.comm
        L = self.L
        desc = self._desc("all_reduce", x, op, algorithm)

        def host_part():
            if problem is not None:
                self._reject("reduce_scatter", problem)
            n = x.numel()
            k = -(-n // L)
            padded = torch.zeros(L * k, dtype=x.dtype, device=c.device)
            padded[:n].copy_(x.reshape(-1))
            return c.local.reduce_scatter(padded, op=op, max_blocks=max_blocks)

        shard = self._step(desc, host_part)
        total = _reduce_hosts(self._inter_all_gather(shard), op)
        full = c.local.all_gather(total, max_blocks=max_blocks)
        dst = x if out is None else out
        dst.view(-1).copy_(full[: x.numel()])
        return dst

    def all_gather(self, x, out, algorithm, max_blocks, problem):
        c = self.comm
        desc = self._desc("all_gather", x, algorithm=algorithm)

        def host_part():
            if problem is not None:
                self._reject("all_gather", problem)
            return c.local.all_gather(x, algorithm=algorithm, max_blocks=max_blocks)

        block = self._step(desc, host_part)
        rows = self._inter_all_gather(block).view(self.H * self.L, -1)
        out.view(c.world_size, -1).copy_(rows.index_select(0, self.gather_order))
        return out

    def reduce_scatter(self, x, op, out, max_blocks, problem):
        import torch.distributed as dist

        c = self.comm
        desc = self._desc("reduce_scatter", x, op)

        def host_part():
            if problem is not None:
                self._reject("reduce_scatter", problem)
            permuted = x.view(c.world_size, -1).index_select(0, self.scatter_order)
            return c.local.reduce_scatter(permuted.view(-1), op=op, max_blocks=max_blocks)

        partial = self._step(desc, host_part)  # [H * m]: host partials of ranks (h, me)
        send = self._on_wire(partial)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.inter)
        out.view(-1).copy_(_reduce_hosts(recv.to(c.device).view(self.H, -1), op))
        return out

    def all_to_all(self, x, out, ins, outs, row_elems, algorithm, max_blocks, problem):
        import torch.distributed as dist

        c = self.comm
        W = c.world_size
        mine = self.hosts[self.host]
        row_bytes = row_elems * x.element_size() if isinstance(x, torch.Tensor) else 0
        desc = self._desc("all_to_all", x, algorithm=algorithm, row_bytes=row_bytes)
        known = ins is not None and outs is not None
        starts = [0] * W
        if known:
            for d in range(1, W):
                starts[d] = starts[d - 1] + ins[d - 1]

        def host_part():
            if problem is not None:
                self._reject("all_to_all", problem)
            rows = x.view(-1, row_elems)
            send = torch.cat([rows[starts[p] : starts[p] + ins[p]] for p in mine])
            got = torch.empty(
                (sum(outs[p] for p in mine), row_elems), dtype=x.dtype, device=c.device
            )
            return c.local.all_to_all(
                send,
                out=got,
                in_splits=[ins[p] for p in mine],
                out_splits=[outs[p] for p in mine],
                algorithm=algorithm,
                max_blocks=max_blocks,
            )

        here = self._step(desc, host_part, splits=(ins, outs) if known else None)
        remote_in = [0 if p in mine else ins[p] for p in range(W)]
        remote_out = [0 if p in mine else outs[p] for p in range(W)]
        rows = x.view(-1, row_elems)
        parts = [rows[starts[p] : starts[p] + ins[p]] for p in range(W) if p not in mine]
        send = self._on_wire(torch.cat(parts) if parts else rows[:0]).contiguous()
        recv = torch.empty((sum(remote_out), row_elems), dtype=x.dtype, device=self.wire)
        dist.all_to_all_single(
            recv,
            send,
            output_split_sizes=remote_out,
            input_split_sizes=remote_in,
            group=self.everyone,
        )
        recv = recv.to(c.device)
        dst = out.view(-1, row_elems)
        at = here_at = recv_at = 0
        for s in range(W):
            n = outs[s]
            if s in mine:
                dst[at : at + n].copy_(here[here_at : here_at + n])
                here_at += n
            else:
                dst[at : at + n].copy_(recv[recv_at : recv_at + n])
                recv_at += n
            at += n
        return out

    def broadcast(self, x, src, max_blocks, problem):
        import torch.distributed as dist

        c = self.comm
        ok = isinstance(src, int) and 0 <= src < c.world_size
        desc = self._desc("broadcast", x, root=src if ok else -1)

        def host_part():
            if problem is not None:
                self._reject("broadcast", problem)
            return c.local.broadcast(x, self.local_of[src], max_blocks=max_blocks)

        self._step(desc, host_part)
        source = self.hosts[self.host_of[src]][self.local_rank]
        root = source if self.group is None else dist.get_global_rank(self.group, source)
        wire = self._on_wire(x)
        dist.broadcast(wire, src=root, group=self.inter)
        if wire is not x:
            x.copy_(wire)
        return x

    def barrier(self):
        import torch.distributed as dist

        self._step(self._desc("barrier"), self.comm.local.barrier)
        if not self.check:  # the descriptor exchange already joined every rank
            flag = torch.zeros(1, device=self.wire)
            dist.all_reduce(flag, group=self.inter)
