# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Communicator: collectives over the ranks of a process group, on mori's symmetric heap.

The protocol (csrc/protocol.hpp) runs on host heaps today; on a CUDA heap the
communicator raises NotSupportedError, since the CUDA collectives are not built.
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
    shmem,
)

from . import _C

_DTYPES = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.int32: "int32",
}
_OPS = ("sum", "max", "min")
_ALGORITHMS = ("auto", "one_shot", "two_shot")
# "auto" picks two-shot above this many bytes: every rank then reduces 1/world of
# the data instead of all of it.
_TWO_SHOT_MIN_BYTES = 256 << 10


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    return type(x).__name__


class Communicator:
    """Collectives over every rank of ``group`` (torch tensors, CPU on a host heap).

    Args:
        group: torch.distributed ProcessGroup; None: the default group. The
            communicator spans the pes of mori's symmetric heap, which it creates
            over ``group`` (``mori.core.shmem.init(group)``) when none exists; the
            heap's pes must be the group's ranks.
        max_bytes: the largest input, in bytes, of any call (the symmetric staging
            buffers are sized from it: about 2 x max_bytes of heap per rank).
        timeout_s: bound on every wait of every call; a rank that does not arrive in
            time makes the others raise MoriTimeoutError naming it, after which this
            communicator refuses further calls (InvalidStateError).

    Construction is collective. Every rank must then make the same calls in the same
    order with matching arguments: a mismatch (collective, size, dtype, op,
    algorithm, source rank, splits) raises InvalidArgumentError on every rank, as
    does an input that fails validation on any rank; the communicator stays usable.
    Results are bit-identical on every rank: reductions run over the ranks in
    ascending order, accumulating bf16/fp16 in fp32 and rounding once.

    Raises:
        NotSupportedError: on a CUDA heap (the CUDA collectives are not built yet).
    """

    def __init__(self, group: Any = None, max_bytes: int = 64 << 20, *, timeout_s: float = 60.0):
        if not isinstance(max_bytes, int) or max_bytes < 1:
            raise InvalidArgumentError(f"max_bytes {max_bytes!r} must be a positive int")
        if not timeout_s > 0:
            raise InvalidArgumentError(f"timeout_s {timeout_s!r} must be > 0")
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
        kind = shmem.info()["kind"]
        if kind != "host":
            raise NotSupportedError(
                f"mori.ccl on a {kind} heap: the CUDA collectives are not built yet (the "
                "collectives run on host heaps: shmem.init(device='cpu'))"
            )
        self.group = group
        self.rank = shmem.my_pe()
        self.world_size = shmem.n_pes()
        self.max_bytes = max_bytes
        self.timeout_s = float(timeout_s)
        self.device = torch.device("cpu")
        self._block = shmem.empty((_C.ccl_block_bytes(self.world_size, max_bytes),), torch.uint8)
        self._impl = _C.CommunicatorCpu(self._block.data_ptr(), max_bytes, self.timeout_s)
        self._timed_out: str | None = None

    # ------------------------------------------------------------------ helpers
    def empty(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """Collective: an uninitialized symmetric tensor on the heap. Passed as an
        input, it is read by the peers where it lies (no staging copy); the call then
        returns only once every peer has read it."""
        return shmem.empty(shape, dtype)

    def _impl_or_raise(self):
        if self._impl is None:
            raise InvalidStateError("this Communicator was closed")
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

    def _run(self, kind: str, problem: str | None, call):
        impl = self._impl_or_raise()
        with self._fails_on_timeout():
            if problem is not None:
                impl.reject(kind, problem)
            call(impl)

    def _check_input(self, name: str, x: Any, nbytes: int | None = None) -> str | None:
        if not isinstance(x, torch.Tensor):
            return f"{name} must be a torch.Tensor, got {_describe(x)}"
        if x.device.type != "cpu":
            return f"{name} is on {x.device}: the collectives run on CPU tensors (host heap)"
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
        if out.device.type != "cpu" or out.dtype != x.dtype or not out.is_contiguous():
            return f"out ({_describe(out)}) must be a contiguous CPU {x.dtype} tensor"
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
    ) -> torch.Tensor:
        """``out = op over ranks of x`` (any shape; bf16, fp16, fp32, int32; sum, max,
        min). In place when ``out`` is None. ``algorithm``: "one_shot" (every rank
        reduces everything), "two_shot" (reduce-scatter, then all-gather), "auto"
        (two-shot from 256 KiB). Returns the output."""
        problem = self._check_input("x", x) or self._check_op(op)
        if problem is None and algorithm not in _ALGORITHMS:
            problem = f"algorithm {algorithm!r} is not one of {', '.join(_ALGORITHMS)}"
        if problem is None and out is not None:
            problem = self._check_out(out, x, x.numel())
        if problem is None and out is None:
            out = x
        if algorithm == "auto" and problem is None:
            nbytes = x.numel() * x.element_size()
            algorithm = "two_shot" if nbytes >= _TWO_SHOT_MIN_BYTES else "one_shot"
        self._run(
            "all_reduce",
            problem,
            lambda impl: impl.all_reduce(
                x.data_ptr(), out.data_ptr(), x.numel(), _DTYPES[x.dtype], op, algorithm
            ),
        )
        return out

    def all_gather(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Every rank's ``x`` ([n, ...]) stacked in rank order into ``[world * n, ...]``
        (a 0-d ``x`` gives ``[world]``). Returns ``out``."""
        problem = self._check_input("x", x)
        shape = None
        if problem is None:
            shape = (self.world_size * x.shape[0], *x.shape[1:]) if x.dim() else (self.world_size,)
            if out is not None:
                problem = self._check_out(out, x, x.numel() * self.world_size)
        if problem is None and out is None:
            out = torch.empty(shape, dtype=x.dtype)
        self._run(
            "all_gather",
            problem,
            lambda impl: impl.all_gather(
                x.data_ptr(), out.data_ptr(), x.numel() * x.element_size(), _DTYPES[x.dtype]
            ),
        )
        return out

    def reduce_scatter(
        self, x: torch.Tensor, op: str = "sum", out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Rank r gets ``op over ranks of x[r * n:(r + 1) * n]`` for ``x`` of shape
        ``[world * n, ...]``; ``out`` is ``[n, ...]``. Returns ``out``."""
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
                out = torch.empty((n, *x.shape[1:]), dtype=x.dtype)
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
    ) -> torch.Tensor:
        """Rank s sends rows ``[sum(in_splits[:d]), + in_splits[d])`` of ``x`` (``[rows,
        ...]``) to rank d; ``out`` holds the rows from each rank in rank order,
        ``out_splits[s]`` from rank s. Splits (int tensors or lists of world ints) default
        to equal splits; with ``in_splits`` given, give ``out_splits`` too (or ``out``,
        whose rows must then split evenly). Returns ``out``."""
        problem = self._check_input("x", x)
        if problem is None and x.dim() == 0:
            problem = "x must have at least one dimension (rows)"
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
                out = torch.empty((total, *x.shape[1:]), dtype=x.dtype)
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

    def broadcast(self, x: torch.Tensor, src: int) -> torch.Tensor:
        """``x`` on every rank becomes rank ``src``'s ``x``, in place. Returns ``x``."""
        problem = self._check_input("x", x)
        if problem is None and (not isinstance(src, int) or not 0 <= src < self.world_size):
            problem = f"src {src!r} out of range [0, {self.world_size})"
        self._run(
            "broadcast",
            problem,
            lambda impl: impl.broadcast(
                x.data_ptr(), x.numel() * x.element_size(), _DTYPES[x.dtype], src
            ),
        )
        return x

    def barrier(self) -> None:
        """Returns once every rank has entered the barrier."""
        self._run("barrier", None, lambda impl: impl.barrier())

    @property
    def calls(self) -> int:
        """Collective calls made so far (the epoch carried in the signal words)."""
        return self._impl_or_raise().epoch

    def close(self) -> None:
        """Drop the communicator's buffers (freed once collected); later calls raise
        InvalidStateError. Not collective."""
        self._impl = None
        self._block = None


_COMMUNICATORS: dict[Any, Communicator] = {}


def _communicator(group: Any) -> Communicator:
    comm = _COMMUNICATORS.get(group)
    if comm is None or comm._impl is None:
        comm = _COMMUNICATORS[group] = Communicator(group)
    return comm


def all_reduce(
    x: torch.Tensor,
    group: Any = None,
    op: str = "sum",
    out: torch.Tensor | None = None,
    algorithm: str = "auto",
) -> torch.Tensor:
    """:meth:`Communicator.all_reduce` on the cached communicator of ``group``
    (created, collectively, on first use with the default max_bytes)."""
    return _communicator(group).all_reduce(x, op=op, out=out, algorithm=algorithm)


def all_gather(x: torch.Tensor, group: Any = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """:meth:`Communicator.all_gather` on the cached communicator of ``group``."""
    return _communicator(group).all_gather(x, out=out)


def reduce_scatter(
    x: torch.Tensor, group: Any = None, op: str = "sum", out: torch.Tensor | None = None
) -> torch.Tensor:
    """:meth:`Communicator.reduce_scatter` on the cached communicator of ``group``."""
    return _communicator(group).reduce_scatter(x, op=op, out=out)


def all_to_all(
    x: torch.Tensor,
    group: Any = None,
    out: torch.Tensor | None = None,
    in_splits: torch.Tensor | None = None,
    out_splits: torch.Tensor | None = None,
) -> torch.Tensor:
    """:meth:`Communicator.all_to_all` on the cached communicator of ``group``."""
    return _communicator(group).all_to_all(x, out=out, in_splits=in_splits, out_splits=out_splits)


def broadcast(x: torch.Tensor, src: int, group: Any = None) -> torch.Tensor:
    """:meth:`Communicator.broadcast` on the cached communicator of ``group``."""
    return _communicator(group).broadcast(x, src)


def barrier(group: Any = None) -> None:
    """:meth:`Communicator.barrier` on the cached communicator of ``group``."""
    _communicator(group).barrier()
