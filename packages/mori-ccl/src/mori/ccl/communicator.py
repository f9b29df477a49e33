# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Communicator: collectives over the ranks of a process group, on mori's symmetric heap.

On a host heap the protocol of csrc/protocol.hpp runs on the calling thread (CPU
tensors); on a CUDA heap the kernels of csrc/protocol_cuda.hpp run on torch's current
stream (CUDA tensors), with no host synchronisation and capturable in CUDA graphs.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

from mori.core import (
    InvalidArgumentError,
    InvalidStateError,
    MoriTimeoutError,
    NotSupportedError,
    env,
    shmem,
    timeouts,
)

from . import _C

_DTYPES = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.int32: "int32",
}
_OPS = ("sum", "max", "min")
_ALGORITHMS = ("auto", "one_shot", "two_shot", "one_shot_ll")
# all_gather / all_to_all: "sm" (kernels load from the peers) or "copy_engine"
# (cudaMemcpyAsync over the peer mappings: no SM moves data; CUDA heaps only).
_MOVE_ALGORITHMS = ("auto", "sm", "copy_engine")
# "auto" picks two-shot above this many bytes: every rank then reduces 1/world of
# the data instead of all of it. The same bound on CUDA heaps, not yet measured there.
_TWO_SHOT_MIN_BYTES = 256 << 10
# The CUDA kernels' default bound on the blocks (SMs) of one call.
_DEFAULT_MAX_BLOCKS = 32
# "0" makes Communicator(zero_copy=None) stage every input (compare the two paths).
ZERO_COPY_ENV = "MORI_CCL_ZERO_COPY"


def _zero_copy_default() -> bool:
    return env.get_bool(ZERO_COPY_ENV, True)


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    return type(x).__name__


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.numel() * t.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """None when a and b are disjoint, else b's start minus a's start (bytes)."""
    (pa, na), (pb, nb) = _span(a), _span(b)
    if na == 0 or nb == 0 or pa >= pb + nb or pb >= pa + na:
        return None
    return pb - pa


class Communicator:
    """Collectives over every rank of ``group`` (CPU tensors on a host heap, CUDA
    tensors on the heap's device on a CUDA heap).

    Args:
        group: torch.distributed ProcessGroup; None: the default group. The
            communicator spans the pes of mori's symmetric heap, which it creates
            over ``group`` (``mori.core.shmem.init(group)``) when none exists; the
            heap's pes must be the group's ranks.
        max_bytes: the largest input, in bytes, of any call (the symmetric staging
            buffers are sized from it: about 2 x max_bytes of heap per rank).
        timeout_s: bound on every wait of every call, in seconds; a rank that does not
            arrive in time makes the others raise MoriTimeoutError naming it (host heap)
            or trap with a message naming it (CUDA heap), after which this communicator
            refuses further calls. ``inf`` or anything above a year means "practically
            forever" (a year); 0, negative values and NaN raise InvalidArgumentError
            naming the value (``mori.core.timeouts``).
        max_blocks: CUDA heaps: the most thread blocks (hence SMs) any call's kernel
            uses, 1 to 64 (default 32); every call may lower it with ``max_blocks=``.
            Every rank must pass the same value (the grid is part of each call's
            descriptor).
        zero_copy: whether an input that lies in the heap (:meth:`empty`, or any
            view of it) is read by the peers where it lies instead of being staged;
            None: the ``MORI_CCL_ZERO_COPY`` environment variable (default 1). On a
            CUDA heap this covers the SM algorithms (not ``one_shot_ll`` and
            ``copy_engine``), the call's kernel ends only once every peer has read
            the input, and every rank must pass a heap input or every rank an
            ordinary one (the choice is part of the call's descriptor: calls that
            differ trap). Every rank must pass the same value.

    Construction is collective. Every rank must then make the same calls in the same
    order with matching arguments: a mismatch (collective, size, dtype, op,
    algorithm, source rank, splits) raises InvalidArgumentError on every rank, as
    does an input that fails validation on any rank; the communicator stays usable.
    Results are bit-identical on every rank: reductions run over the ranks in
    ascending order, accumulating bf16/fp16 in fp32 and rounding once.

    On a CUDA heap every call is enqueued on torch's current stream of the heap's
    device and returns at once (no host synchronisation); calls may be captured in a
    CUDA graph and replayed (the call counter lives on the device). Calls of one
    communicator must run in order on the device (one stream, or streams the caller
    orders). What only the device can see ends in a trap with a message, which
    loses the process's CUDA context (as mori-ep's kernels do): a rank that does not
    arrive within ``timeout_s`` (named), ranks whose calls differ (both calls
    printed: each call's signal carries a hash of its collective, size, dtype, op,
    algorithm, grid and source rank), all-to-all splits that disagree. An input that
    fails validation on one rank raises InvalidArgumentError there and makes the
    other ranks' kernels trap naming it; that communicator then refuses calls.

    A heap that spans hosts (``shmem.info()["local_pes"]`` not every pe) makes a
    two-level communicator (hosts.py): each host's part on mori over the host's pes,
    the part between hosts through ``group``'s torch.distributed backend.

    Raises:
        NotSupportedError: a CUDA heap with a mori.ccl built without CUDA, more than
            8 ranks of one host on a CUDA heap, or hosts with unequal numbers of ranks.
    """

    def __init__(
        self,
        group: Any = None,
        max_bytes: int = 64 << 20,
        *,
        timeout_s: float = 60.0,
        max_blocks: int | None = None,
        zero_copy: bool | None = None,
        _team: list[int] | None = None,
    ):
        if not isinstance(max_bytes, int) or max_bytes < 1:
            raise InvalidArgumentError(f"max_bytes {max_bytes!r} must be a positive int")
        timeout_s = timeouts.seconds(timeout_s, "timeout_s")
        if max_blocks is not None and (
            not isinstance(max_blocks, int) or not 1 <= max_blocks <= _C.cuda_max_blocks
        ):
            raise InvalidArgumentError(
                f"max_blocks {max_blocks!r} must be an int in [1, {_C.cuda_max_blocks}]"
            )
        if zero_copy is None:
            zero_copy = _zero_copy_default()
        elif not isinstance(zero_copy, bool):
            raise InvalidArgumentError(f"zero_copy {zero_copy!r} must be a bool or None")
        import torch.distributed as dist

        if not shmem.initialized():
            shmem.init(group=group, timeout_s=max(float(timeout_s), 1.0))
        if dist.is_available() and dist.is_initialized():
            g_rank, g_size = dist.get_rank(group), dist.get_world_size(group)
            if (g_rank, g_size) != (shmem.my_pe(), shmem.n_pes()):
                raise NotSupportedError(
                    f"the group has rank {g_rank} of {g_size}, the shmem heap pe "
                    f"{shmem.my_pe()} of {shmem.n_pes()}: a communicator spans the heap's pes"
                )
        info = shmem.info()
        kind = info["kind"]
        if kind not in ("host", "cuda"):
            raise NotSupportedError(f"mori.ccl on a {kind} heap")
        if kind == "cuda" and not getattr(_C, "with_cuda", False):
            raise NotSupportedError(
                "mori.ccl on a cuda heap: this mori.ccl was built without its CUDA kernels "
                "(rebuild with MORI_CUDA=on), or use a host heap: shmem.init(device='cpu')"
            )
        self.group = group
        self.rank = shmem.my_pe()
        self.world_size = shmem.n_pes()
        self.max_bytes = max_bytes
        self.timeout_s = float(timeout_s)
        self.cuda = kind == "cuda"
        self.max_blocks = max_blocks or _DEFAULT_MAX_BLOCKS
        self.zero_copy = zero_copy
        self._timed_out: str | None = None
        self._rejected: str | None = None
        self._spanning = None
        self.local: Communicator | None = None
        local_pes = sorted(int(p) for p in info["local_pes"])
        if _team is None and len(local_pes) != self.world_size:
            # The heap spans hosts: the host's part on a communicator over the host's
            # pes, the rest through the group's backend (hosts.py).
            from .hosts import SpanningHosts

            self.device = (
                torch.device("cuda", int(info["device"])) if self.cuda else torch.device("cpu")
            )
            # The host's all-reduce shards are padded to a multiple of its ranks.
            self.local = Communicator(
                group,
                max_bytes + 64 * len(local_pes),
                timeout_s=timeout_s,
                max_blocks=max_blocks,
                zero_copy=zero_copy,
                _team=local_pes,
            )
            self._impl = self.local._impl
            self._block = None
            self._spanning = SpanningHosts(self, group, local_pes)
            return
        team = list(_team or [])
        if team:
            self.rank, self.world_size = team.index(self.rank), len(team)
        if self.cuda:
            if self.world_size > _C.cuda_max_world_size:
                raise NotSupportedError(
                    f"the CUDA collectives take up to {_C.cuda_max_world_size} ranks, the heap "
                    f"has {self.world_size}"
                )
            self.device = torch.device("cuda", int(info["device"]))
            nbytes = _C.ccl_cuda_block_bytes(self.world_size, max_bytes)
            self._block = shmem.empty((nbytes,), torch.uint8)
            self._impl = _C.CommunicatorCuda(
                self._block.data_ptr(),
                max_bytes,
                self.device.index,
                self.timeout_s,
                self.max_blocks,
                team,
                zero_copy,
            )
        else:
            self.device = torch.device("cpu")
            nbytes = _C.ccl_block_bytes(self.world_size, max_bytes)
            self._block = shmem.empty((nbytes,), torch.uint8)
            self._impl = _C.CommunicatorCpu(
                self._block.data_ptr(), max_bytes, self.timeout_s, team, zero_copy
            )

    # ------------------------------------------------------------------ helpers
    def empty(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """Collective: an uninitialized symmetric tensor on the heap (``shape``, any
        ``dtype``). Passed as an input (it or any view of it) it is read by the peers
        where it lies, with no staging copy, unless the communicator was made with
        ``zero_copy=False``. On a host heap the call returns only once every peer has
        read it; on a CUDA heap (SM algorithms; ``one_shot_ll`` and ``copy_engine``
        still stage) the call's kernel ends only once every peer has read it, so work
        after the call on the stream may overwrite it. On a CUDA heap every rank must
        then pass such an input (the choice is part of the call's descriptor)."""
        return shmem.empty(shape, dtype)

    def _impl_or_raise(self):
        if self._impl is None:
            raise InvalidStateError("this Communicator was closed")
        if self._rejected is not None:
            raise InvalidStateError(
                f"this Communicator rejected a call earlier ({self._rejected}); on a CUDA heap "
                "that makes the other ranks' kernels trap: create a new one"
            )
        if self._timed_out is not None:
            raise InvalidStateError(
                f"this Communicator timed out earlier ({self._timed_out}); its ranks no longer "
                "agree on the call they are in: create a new one"
            )
        return self._impl

    @contextlib.contextmanager
    def _fails_on_timeout(self):
        try:
            yield
        except MoriTimeoutError as e:
            self._timed_out = str(e).splitlines()[0]
            raise

    def _stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream

    def _run(self, kind: str, problem: str | None, call):
        impl = self._impl_or_raise()
        if self.cuda:
            if problem is not None:
                self._rejected = problem
                impl.reject(problem, self._stream())
            call(impl, self._stream())
            return
        with self._fails_on_timeout():
            if problem is not None:
                impl.reject(kind, problem)
            call(impl)

    def _reject(self, kind: str, problem: str) -> None:
        """Take part in a call of ``kind`` as a rank whose input failed validation
        (``problem``): raises InvalidArgumentError here, the other ranks' calls fail
        naming this rank."""
        self._run(kind, problem, None)

    def _blocks(self, max_blocks: Any) -> tuple[int, str | None]:
        if max_blocks is None:
            return 0, None
        if not isinstance(max_blocks, int) or not 1 <= max_blocks <= _C.cuda_max_blocks:
            return 0, f"max_blocks {max_blocks!r} must be an int in [1, {_C.cuda_max_blocks}]"
        return max_blocks, None

    def _on_device(self, t: torch.Tensor) -> bool:
        if self.cuda:
            return t.device.type == "cuda" and t.device.index == self.device.index
        return t.device.type == "cpu"

    def _check_input(self, name: str, x: Any, nbytes: int | None = None) -> str | None:
        if not isinstance(x, torch.Tensor):
            return f"{name} must be a torch.Tensor, got {_describe(x)}"
        if not self._on_device(x):
            where = f"{self.device} tensors (CUDA heap)" if self.cuda else "CPU tensors (host heap)"
            return f"{name} is on {x.device}: the collectives run on {where}"
        if x.dtype not in _DTYPES:
            return f"{name} has dtype {x.dtype}; supported: {', '.join(str(d) for d in _DTYPES)}"
        if not x.is_contiguous():
            return f"{name} ({_describe(x)}) is not contiguous"
        size = x.numel() * x.element_size() if nbytes is None else nbytes
        if size > self.max_bytes:
            return (
                f"{name} has {size} bytes, more than the communicator's max_bytes {self.max_bytes}"
            )
        return None

    def _check_out(self, out: Any, x: torch.Tensor, numel: int) -> str | None:
        if not isinstance(out, torch.Tensor):
            return f"out must be a torch.Tensor, got {_describe(out)}"
        if not self._on_device(out) or out.dtype != x.dtype or not out.is_contiguous():
            return f"out ({_describe(out)}) must be a contiguous {x.dtype} tensor on {self.device}"
        if out.numel() != numel:
            return f"out has {out.numel()} elements, expected {numel}"
        return None

    @staticmethod
    def _check_op(op: Any) -> str | None:
        return None if op in _OPS else f"op {op!r} is not one of {', '.join(_OPS)}"

    # -------------------------------------------------------------- collectives
    def all_reduce(
        self,
        x: torch.Tensor,
        op: str = "sum",
        out: torch.Tensor | None = None,
        algorithm: str = "auto",
        *,
        max_blocks: int | None = None,
    ) -> torch.Tensor:
        """``out = op over ranks of x`` (any shape; bf16, fp16, fp32, int32; sum, max,
        min). In place when ``out`` is None (``out`` may also be ``x``; a partial
        overlap is refused). ``algorithm``: "one_shot" (every rank reduces
        everything), "two_shot" (reduce-scatter, then all-gather), "one_shot_ll" (CUDA
        heaps, inputs up to 256 KiB: one-shot with packets that carry their own flag,
        no separate flag exchange), "auto" (two-shot from 256 KiB, else one-shot). ``max_blocks``: CUDA heaps, the call's bound on thread blocks.
        Returns the output."""
        problem = self._check_input("x", x) or self._check_op(op)
        if problem is None and algorithm not in _ALGORITHMS:
            problem = f"algorithm {algorithm!r} is not one of {', '.join(_ALGORITHMS)}"
        if problem is None and algorithm == "one_shot_ll":
            nbytes = x.numel() * x.element_size()
            if not self.cuda:
                problem = "algorithm 'one_shot_ll' needs a CUDA heap"
            elif nbytes > self._impl.ll_max_bytes:
                problem = f"one_shot_ll takes inputs up to {self._impl.ll_max_bytes} bytes, x has {nbytes}"
        if problem is None and out is not None:
            problem = self._check_out(out, x, x.numel())
        if problem is None and out is None:
            out = x
        # As torch's out= and NCCL's in-place calls: out is x itself or disjoint from it,
        # on every heap.
        if problem is None and _overlap(x, out) not in (None, 0):
            problem = "out partially overlaps x (give x itself, or a disjoint tensor)"
        blocks, bad = self._blocks(max_blocks)
        problem = problem or bad
        if algorithm == "auto" and problem is None:
            nbytes = x.numel() * x.element_size()
            algorithm = "two_shot" if nbytes >= _TWO_SHOT_MIN_BYTES else "one_shot"
        if self._spanning is not None:
            return self._spanning.all_reduce(x, op, out, algorithm, max_blocks, problem)
        if self.cuda:
            self._run(
                "all_reduce",
                problem,
                lambda impl, stream: impl.all_reduce(
                    x.data_ptr(),
                    out.data_ptr(),
                    x.numel(),
                    _DTYPES[x.dtype],
                    op,
                    algorithm,
                    blocks,
                    stream,
                ),
            )
            return out
        self._run(
            "all_reduce",
            problem,
            lambda impl: impl.all_reduce(
                x.data_ptr(), out.data_ptr(), x.numel(), _DTYPES[x.dtype], op, algorithm
            ),
        )
        return out

    def _check_move_algorithm(self, algorithm: Any) -> str | None:
        if algorithm not in _MOVE_ALGORITHMS:
            return f"algorithm {algorithm!r} is not one of {', '.join(_MOVE_ALGORITHMS)}"
        if algorithm == "copy_engine" and not self.cuda:
            return "algorithm 'copy_engine' needs a CUDA heap"
        return None

    def all_gather(
        self,
        x: torch.Tensor,
        out: torch.Tensor | None = None,
        algorithm: str = "auto",
        *,
        max_blocks: int | None = None,
    ) -> torch.Tensor:
        """Every rank's ``x`` ([n, ...]) stacked in rank order into ``[world * n, ...]``
        (a 0-d ``x`` gives ``[world]``). ``algorithm``: "sm" (the kernel loads from
        the peers), "copy_engine" (CUDA heaps: cudaMemcpyAsync over the peer
        mappings, no SM moves data), "auto" ("sm"). ``x`` may be rank r's slot of
        ``out``. Returns ``out``."""
        problem = self._check_input("x", x) or self._check_move_algorithm(algorithm)
        shape = None
        if problem is None:
            shape = (self.world_size * x.shape[0], *x.shape[1:]) if x.dim() else (self.world_size,)
            if out is not None:
                problem = self._check_out(out, x, x.numel() * self.world_size)
        if problem is None and out is None:
            out = torch.empty(shape, dtype=x.dtype, device=self.device)
        if problem is None and self.cuda:
            at = _overlap(out, x)
            nbytes = x.numel() * x.element_size()
            if at is not None and (nbytes == 0 or at % nbytes or at < 0):
                problem = "x overlaps out other than as one rank's slot of it"
        blocks, bad = self._blocks(max_blocks)
        problem = problem or bad
        if self._spanning is not None:
            return self._spanning.all_gather(x, out, algorithm, max_blocks, problem)
        if self.cuda:
            algo = "sm" if algorithm == "auto" else algorithm
            self._run(
                "all_gather",
                problem,
                lambda impl, stream: impl.all_gather(
                    x.data_ptr(),
                    out.data_ptr(),
                    x.numel() * x.element_size(),
                    _DTYPES[x.dtype],
                    algo,
                    blocks,
                    stream,
                ),
            )
            return out
        self._run(
            "all_gather",
            problem,
            lambda impl: impl.all_gather(
                x.data_ptr(), out.data_ptr(), x.numel() * x.element_size(), _DTYPES[x.dtype]
            ),
        )
        return out

    def reduce_scatter(
        self,
        x: torch.Tensor,
        op: str = "sum",
        out: torch.Tensor | None = None,
        *,
        max_blocks: int | None = None,
    ) -> torch.Tensor:
        """Rank r gets ``op over ranks of x[r * n:(r + 1) * n]`` for ``x`` of shape
        ``[world * n, ...]``; ``out`` is ``[n, ...]`` (on a CUDA heap it may be one
        of x's n-row slices). Returns ``out``."""
        problem = self._check_input("x", x) or self._check_op(op)
        if problem is None and (x.dim() == 0 or x.shape[0] % self.world_size):
            problem = (
                f"x ({_describe(x)}) must have a first dimension divisible by the world size "
                f"{self.world_size}"
            )
        if problem is None:
            n = x.shape[0] // self.world_size
            if out is not None:
                problem = self._check_out(out, x, x.numel() // self.world_size)
            else:
                out = torch.empty((n, *x.shape[1:]), dtype=x.dtype, device=self.device)
        if problem is None and self.cuda:
            at = _overlap(x, out)
            seg = x.numel() // self.world_size * x.element_size()
            if at is not None and (seg == 0 or at % seg or at < 0):
                problem = "out overlaps x other than as one of its n-row slices"
        blocks, bad = self._blocks(max_blocks)
        problem = problem or bad
        if self._spanning is not None:
            return self._spanning.reduce_scatter(x, op, out, max_blocks, problem)
        if self.cuda:
            self._run(
                "reduce_scatter",
                problem,
                lambda impl, stream: impl.reduce_scatter(
                    x.data_ptr(),
                    out.data_ptr(),
                    out.numel(),
                    _DTYPES[x.dtype],
                    op,
                    blocks,
                    stream,
                ),
            )
            return out
        self._run(
            "reduce_scatter",
            problem,
            lambda impl: impl.reduce_scatter(
                x.data_ptr(), out.data_ptr(), out.numel(), _DTYPES[x.dtype], op
            ),
        )
        return out

    def _splits(
        self, name: str, splits: Any, rows: int | None
    ) -> tuple[list[int] | None, str | None]:
        if splits is None:
            if rows is None or rows % self.world_size:
                return None, (
                    f"without {name}, {rows} rows do not split evenly over {self.world_size} ranks"
                )
            return [rows // self.world_size] * self.world_size, None
        try:
            values = splits.tolist() if isinstance(splits, torch.Tensor) else list(splits)
        except TypeError:
            return None, f"{name} must be a tensor or a list of ints, got {type(splits).__name__}"
        if len(values) != self.world_size or any(not isinstance(v, int) or v < 0 for v in values):
            return None, f"{name} {values} must hold {self.world_size} ints >= 0"
        if rows is not None and sum(values) != rows:
            return None, f"{name} {values} sum to {sum(values)}, the tensor has {rows} rows"
        return values, None

    def all_to_all(
        self,
        x: torch.Tensor,
        out: torch.Tensor | None = None,
        in_splits: torch.Tensor | None = None,
        out_splits: torch.Tensor | None = None,
        algorithm: str = "auto",
        *,
        max_blocks: int | None = None,
    ) -> torch.Tensor:
        """Rank s sends rows ``[sum(in_splits[:d]), + in_splits[d])`` of ``x`` (``[rows,
        ...]``) to rank d; ``out`` holds the rows from each rank in rank order,
        ``out_splits[s]`` from rank s. Splits (int tensors or lists of world ints) default
        to equal splits; with ``in_splits`` given, give ``out_splits`` too (or ``out``,
        whose rows must then split evenly). Returns ``out``.

        CUDA heaps: splits on the device (any int dtype, ``[world]``) are read by the
        kernel, so an all-to-all-v needs no host synchronisation and can be captured
        in a CUDA graph; ``x`` and ``out`` are then capacities (``sum(in_splits)`` and
        ``sum(out_splits)`` rows at most, checked on the device; rows past them are
        not sent / left untouched). Without ``out`` the total is
        read back from the device (a host synchronisation; refused while capturing).
        ``algorithm``: "sm", "copy_engine" (equal splits only), "auto" ("sm")."""
        problem = self._check_input("x", x) or self._check_move_algorithm(algorithm)
        if problem is None and x.dim() == 0:
            problem = "x must have at least one dimension (rows)"
        if self.cuda and self._spanning is None:
            return self._all_to_all_cuda(
                x, out, in_splits, out_splits, algorithm, max_blocks, problem
            )
        ins = outs = None
        if problem is None:
            ins, problem = self._splits("in_splits", in_splits, x.shape[0])
        if problem is None:
            out_rows = out.shape[0] if isinstance(out, torch.Tensor) and out.dim() else None
            if out_splits is None and out_rows is None and in_splits is not None:
                problem = "all_to_all with in_splits needs out_splits (or out)"
            elif out_splits is None and out_rows is None:
                out_rows = x.shape[0]
        if problem is None:
            outs, problem = self._splits("out_splits", out_splits, out_rows)
        row_elems = math.prod(x.shape[1:]) if problem is None else 0
        if problem is None:
            total = sum(outs)
            if out is not None:
                problem = self._check_out(out, x, total * row_elems)
            else:
                out = torch.empty((total, *x.shape[1:]), dtype=x.dtype, device=self.device)
        if self._spanning is not None:
            if problem is None and self.cuda and _overlap(x, out) is not None:
                problem = "out overlaps x (all_to_all is not in place)"
            return self._spanning.all_to_all(
                x, out, ins, outs, row_elems, algorithm, max_blocks, problem
            )
        self._run(
            "all_to_all",
            problem,
            lambda impl: impl.all_to_all(
                x.data_ptr(),
                out.data_ptr(),
                row_elems * x.element_size(),
                ins,
                outs,
                _DTYPES[x.dtype],
            ),
        )
        return out

    def _device_splits(
        self, name: str, splits: Any, rows: int | None
    ) -> tuple[torch.Tensor | None, list[int] | None, str | None]:
        """(device int64 tensor or None for equal splits, the values when the host
        knows them, problem)."""
        if splits is None:
            if rows is not None and rows % self.world_size:
                return (
                    None,
                    None,
                    (
                        f"without {name}, {rows} rows do not split evenly over {self.world_size} ranks"
                    ),
                )
            return None, None if rows is None else [rows // self.world_size] * self.world_size, None
        if isinstance(splits, torch.Tensor) and splits.device.type == "cuda":
            if splits.device != self.device:
                return (
                    None,
                    None,
                    f"{name} is on {splits.device}, the communicator on {self.device}",
                )
            if (
                splits.dtype.is_floating_point
                or splits.dtype.is_complex
                or splits.numel() != (self.world_size)
            ):
                return (
                    None,
                    None,
                    (f"{name} ({_describe(splits)}) must hold {self.world_size} integers"),
                )
            return splits.reshape(-1).to(torch.int64).contiguous(), None, None
        values, problem = self._splits(name, splits, rows)
        if problem is not None:
            return None, None, problem
        return torch.tensor(values, dtype=torch.int64, device=self.device), values, None

    def _all_to_all_cuda(self, x, out, in_splits, out_splits, algorithm, max_blocks, problem):
        ins = outs = None
        out_known = None
        row_elems = 0
        if problem is None:
            ins, _, problem = self._device_splits("in_splits", in_splits, x.shape[0])
        if problem is None:
            out_rows = out.shape[0] if isinstance(out, torch.Tensor) and out.dim() else None
            if out_splits is None and out_rows is None and in_splits is not None:
                problem = "all_to_all with in_splits needs out_splits (or out)"
            elif out_splits is None and out_rows is None:
                out_rows = x.shape[0]
        if problem is None:
            known_rows = (
                out_rows
                if out_splits is None
                or not isinstance(out_splits, torch.Tensor)
                or out_splits.device.type != "cuda"
                else None
            )
            outs, out_known, problem = self._device_splits("out_splits", out_splits, known_rows)
        if problem is None:
            row_elems = math.prod(x.shape[1:])
            if out is None:
                if out_known is not None:
                    total = sum(out_known)
                elif torch.cuda.is_current_stream_capturing():
                    problem = "all_to_all with device out_splits needs out while capturing a graph"
                else:
                    total = int(outs.sum().item())
                if problem is None:
                    out = torch.empty((total, *x.shape[1:]), dtype=x.dtype, device=self.device)
            elif (
                out_known is not None and out_splits is not None and out.shape[0] != sum(out_known)
            ):
                problem = f"out has {out.shape[0]} rows, out_splits sum to {sum(out_known)}"
        if problem is None:
            if not self._on_device(out) or out.dtype != x.dtype or not out.is_contiguous():
                problem = (
                    f"out ({_describe(out)}) must be a contiguous {x.dtype} tensor on {self.device}"
                )
            elif out.dim() == 0 or math.prod(out.shape[1:]) != row_elems:
                problem = f"out ({_describe(out)}) must have rows of x's {row_elems} elements"
            elif _overlap(x, out) is not None:
                problem = "out overlaps x (all_to_all is not in place)"
        if (
            problem is None
            and algorithm == "copy_engine"
            and (in_splits is not None or out_splits is not None or out.shape[0] != x.shape[0])
        ):
            problem = "the copy-engine all_to_all takes equal splits only (no in/out_splits)"
        blocks, bad = self._blocks(max_blocks)
        problem = problem or bad
        algo = "sm" if algorithm == "auto" else algorithm
        if algo == "copy_engine":
            ins = outs = None
        self._run(
            "all_to_all",
            problem,
            lambda impl, stream: impl.all_to_all(
                x.data_ptr(),
                out.data_ptr(),
                row_elems * x.element_size(),
                x.shape[0],
                out.shape[0],
                0 if ins is None else ins.data_ptr(),
                0 if outs is None else outs.data_ptr(),
                _DTYPES[x.dtype],
                algo,
                blocks,
                stream,
            ),
        )
        return out

    def broadcast(
        self, x: torch.Tensor, src: int, *, max_blocks: int | None = None
    ) -> torch.Tensor:
        """``x`` on every rank becomes rank ``src``'s ``x``, in place. Returns ``x``."""
        problem = self._check_input("x", x)
        if problem is None and (not isinstance(src, int) or not 0 <= src < self.world_size):
            problem = f"src {src!r} out of range [0, {self.world_size})"
        blocks, bad = self._blocks(max_blocks)
        problem = problem or bad
        if self._spanning is not None:
            return self._spanning.broadcast(x, src, max_blocks, problem)
        if self.cuda:
            self._run(
                "broadcast",
                problem,
                lambda impl, stream: impl.broadcast(
                    x.data_ptr(),
                    x.numel() * x.element_size(),
                    _DTYPES[x.dtype],
                    src,
                    blocks,
                    stream,
                ),
            )
            return x
        self._run(
            "broadcast",
            problem,
            lambda impl: impl.broadcast(
                x.data_ptr(), x.numel() * x.element_size(), _DTYPES[x.dtype], src
            ),
        )
        return x

    def barrier(self) -> None:
        """Host heap: returns once every rank has entered the barrier. CUDA heap:
        enqueued on the current stream; work after it on the stream runs once every
        rank's stream reached it."""
        if self._spanning is not None:
            self._spanning.barrier()
            return
        if self.cuda:
            self._run("barrier", None, lambda impl, stream: impl.barrier(stream))
            return
        self._run("barrier", None, lambda impl: impl.barrier())

    @property
    def calls(self) -> int:
        """Collective calls made so far (the epoch carried in the signal words; on a
        CUDA heap the calls enqueued from the host, graph replays not counted)."""
        impl = self._impl_or_raise()
        if self._spanning is not None:
            return self._spanning.calls
        return impl.calls if self.cuda else impl.epoch

    def close(self) -> None:
        """Drop the communicator's buffers (freed once collected); later calls raise
        InvalidStateError. Not collective."""
        self._impl = None
        self._block = None
        if self.local is not None:
            self.local.close()
