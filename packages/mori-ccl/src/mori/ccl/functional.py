# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.ccl's functional shortcuts: each collective on one cached
:class:`~mori.ccl.Communicator` per group (created, collectively, on first use with the
default ``max_bytes``)."""

from __future__ import annotations

from typing import Any

import torch

from .communicator import Communicator

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


def all_gather(
    x: torch.Tensor, group: Any = None, out: torch.Tensor | None = None, algorithm: str = "auto"
) -> torch.Tensor:
    """:meth:`Communicator.all_gather` on the cached communicator of ``group``."""
    return _communicator(group).all_gather(x, out=out, algorithm=algorithm)


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
    algorithm: str = "auto",
) -> torch.Tensor:
    """:meth:`Communicator.all_to_all` on the cached communicator of ``group``."""
    return _communicator(group).all_to_all(
        x, out=out, in_splits=in_splits, out_splits=out_splits, algorithm=algorithm
    )


def broadcast(x: torch.Tensor, src: int, group: Any = None) -> torch.Tensor:
    """:meth:`Communicator.broadcast` on the cached communicator of ``group``."""
    return _communicator(group).broadcast(x, src)


def barrier(group: Any = None) -> None:
    """:meth:`Communicator.barrier` on the cached communicator of ``group``."""
    _communicator(group).barrier()
