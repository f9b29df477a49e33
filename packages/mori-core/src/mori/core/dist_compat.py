# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""torch.distributed's single-tensor collectives under their current names.

torch 2.13 renamed ``all_gather_into_tensor`` to ``all_gather_single`` and
``reduce_scatter_tensor`` to ``reduce_scatter_single``, and the old names warn
(FutureWarning) on every call. These wrappers call the new name where the installed
torch has it and the old one otherwise, so mori, its tests and its benches work on
older torch without printing warnings on newer torch. torch is imported on first
use, so importing this module costs nothing for torch-free users.
"""

from __future__ import annotations

from typing import Any


def _pick(new: str, old: str):
    import torch.distributed as dist

    fn = getattr(dist, new, None)
    return fn if fn is not None else getattr(dist, old)


def all_gather_single(output: Any, input: Any, group: Any = None, async_op: bool = False):
    """Gather equal-size ``input`` tensors of every rank into ``output``
    (``world_size × input.numel()`` elements, rank order)."""
    return _pick("all_gather_single", "all_gather_into_tensor")(
        output, input, group=group, async_op=async_op
    )


def reduce_scatter_single(
    output: Any, input: Any, op: Any = None, group: Any = None, async_op: bool = False
):
    """Reduce ``input`` (``world_size × output.numel()`` elements) across ranks and
    leave rank r's share in ``output``; ``op`` defaults to ``ReduceOp.SUM``."""
    import torch.distributed as dist

    if op is None:
        op = dist.ReduceOp.SUM
    return _pick("reduce_scatter_single", "reduce_scatter_tensor")(
        output, input, op=op, group=group, async_op=async_op
    )
