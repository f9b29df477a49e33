# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Where an op runs: on a host heap (the CPU implementations, among real processes)
or on a CUDA heap (the kernels, on torch's current stream).

Every native implementation takes the same arguments on both (a CPU implementation
ignores the launch shape and the stream), so a mode calls ``impl.dispatch(...)`` one
way. What still differs is said once, here: the stream (0 on the host), whether the
host may read the op's tensors without a synchronisation (the host-side checks the
kernels make on the device otherwise), the event behind ``async_finish`` and which
native local-expert count runs.
"""

from __future__ import annotations

import torch

from mori.core import NotSupportedError, shmem

from ._C import local_expert_count_cpu, with_cuda

try:  # a build with CUDA
    from ._C import local_expert_count_cuda
except ImportError:
    local_expert_count_cuda = None


class HostPlacement:
    """A host heap: the CPU implementations, on the calling thread."""

    host = True
    """The op's tensors are host memory: reading one costs no synchronisation."""

    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.index = -1  # what the native constructors take as the CUDA ordinal

    def stream(self) -> int:
        return 0

    def host_count(self, t: torch.Tensor) -> int:
        """The count held in ``t`` (int32 ``[1]``)."""
        return int(t)

    def record_event(self) -> None:
        """Nothing to wait for: a host call has finished when it returns."""
        return None

    def native(self, cpu_class, cuda_class, what: str):
        del cuda_class, what
        return cpu_class

    def count_local_experts(self, indices, total_recv, rank, experts_per_rank, top_k, counts,
                            entries):  # fmt: skip
        """``counts[e]`` = (row, slot) pairs of ``indices`` rows ``[0, *total_recv)``
        naming local expert e (addresses; ``entries``: the buffer's size in ids)."""
        del entries
        local_expert_count_cpu(indices, total_recv, rank, experts_per_rank, top_k, counts)


class CudaPlacement:
    """A CUDA heap: kernels enqueued on torch's current stream, no host synchronisation."""

    host = False

    def __init__(self, index: int) -> None:
        self.device = torch.device("cuda", index)
        self.index = index

    def stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream

    def host_count(self, t: torch.Tensor) -> int:
        """0: the count is on the device and reading it would synchronise; the
        kernels check what the host would have checked with it."""
        del t
        return 0

    def record_event(self) -> torch.cuda.Event:
        """An event recorded on the current stream after the call's kernels."""
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def native(self, cpu_class, cuda_class, what: str):
        del cpu_class
        if cuda_class is None:
            raise NotSupportedError(
                f"{what} has no CUDA kernels in this build; use a host heap (the CPU "
                "implementation)"
            )
        return cuda_class

    def count_local_experts(self, indices, total_recv, rank, experts_per_rank, top_k, counts,
                            entries):  # fmt: skip
        """As :meth:`HostPlacement.count_local_experts`: one kernel on the current
        stream, its grid sized by ``entries``."""
        blocks = max(1, min(64, -(-entries // 256)))
        local_expert_count_cuda(indices, total_recv, rank, experts_per_rank, top_k, counts,
                                   blocks, 256, self.stream())  # fmt: skip


def placement_for(config) -> HostPlacement | CudaPlacement:
    """The placement of an op of ``config`` on the initialised shmem heap: the op runs
    where the heap is (``config.device`` may only confirm it)."""
    info = shmem.info()
    kind = info["kind"]
    device = config.device or ("cpu" if kind == "host" else "cuda")
    if (device == "cuda") != (kind == "cuda"):
        raise NotSupportedError(
            f"device {device!r} on a {kind} heap: the op runs where the heap is "
            "(shmem.init(device='cpu') for the CPU implementation, a CUDA device for the "
            "kernels)"
        )
    if kind == "cuda" and not with_cuda:
        raise NotSupportedError(
            "mori.ep was built without CUDA (MORI_CUDA=off): the dispatch/combine kernels "
            "are missing; rebuild with MORI_CUDA=on or use a host heap"
        )
    return CudaPlacement(info["device"]) if kind == "cuda" else HostPlacement()
