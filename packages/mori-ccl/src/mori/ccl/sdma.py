# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""ROCm/mori's ``AllreduceSdma``, ``AllgatherSdma`` and ``All2allSdma`` call shapes over
:class:`~mori.ccl.Communicator`.

On AMD GPUs MORI moves these collectives' data with the SDMA engines; here "Sdma"
means the copy engines: all-gather and all-to-all run as ``algorithm="copy_engine"``
(cudaMemcpyAsync over the symmetric heap's peer mappings, no SM moves data), and the
all-reduce's reduction runs on SMs (one-shot up to 1 MiB, two-shot above, MORI's
split). On a host heap the same calls run the CPU collectives (a check, CI).

Differences from MORI, each raising rather than doing something else:
``copy_output_to_user=False`` (MORI leaves the result in its transit buffer) is not
supported; MORI_ENABLE_SDMA is not required. Without sizes the communicator's buffers
take 64 MiB of input (MORI reserves 512 MiB transit buffers); pass the sizes you need.
mori's heap must be initialised first (``mori.core.shmem.init`` or MORI's
``shmem_torch_process_group_init`` through ``mori.shmem``), with ``my_pe`` / ``npes``
matching it.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from mori.core import InvalidArgumentError, NotSupportedError, shmem

from .communicator import Communicator

_DEFAULT_MAX_BYTES = 64 << 20
# MORI's AllreduceSdma dtypes; uint32 sums as int32 (the same bits: addition modulo 2^32).
_ALLREDUCE_DTYPES = (torch.uint32, torch.int32, torch.float32, torch.float16, torch.bfloat16)


def _as_signed(t: torch.Tensor) -> torch.Tensor:
    """uint32 (MORI's default element type) as int32: the collectives take int32."""
    return t.view(torch.int32) if t.dtype == torch.uint32 else t


class _Sdma:
    _name = "Sdma"

    def __init__(
        self,
        my_pe: int,
        npes: int,
        input_buffer_size: int | None = None,
        output_buffer_size: int | None = None,
        transit_buffer_size: int | None = None,
        copy_output_to_user: bool = True,
    ):
        if not shmem.initialized():
            raise InvalidArgumentError(
                f"{self._name}: mori's symmetric heap is not initialised (mori.core.shmem.init "
                "or mori.shmem.shmem_torch_process_group_init first)"
            )
        if (my_pe, npes) != (shmem.my_pe(), shmem.n_pes()):
            raise InvalidArgumentError(
                f"{self._name}(my_pe={my_pe}, npes={npes}): the heap has pe {shmem.my_pe()} of "
                f"{shmem.n_pes()}"
            )
        if not copy_output_to_user:
            raise NotSupportedError(
                f"{self._name}: copy_output_to_user=False (the result left in a transit "
                "buffer) is not supported; the output tensor always receives it"
            )
        self.my_pe, self.npes = my_pe, npes
        self.copy_output_to_user = copy_output_to_user
        self._comm = Communicator(
            max_bytes=self._max_bytes(input_buffer_size, output_buffer_size, transit_buffer_size)
        )
        self._pending: tuple[Any, float] | None = None

    def _max_bytes(self, input_size, output_size, transit_size) -> int:
        """The largest input of one call, from MORI's buffer sizes."""
        if input_size is not None and output_size is not None:
            return int(input_size)
        if transit_size is not None:
            return int(transit_size)
        return _DEFAULT_MAX_BYTES

    def _move_algorithm(self) -> str:
        return "copy_engine" if self._comm.cuda else "auto"

    def _on(self, stream):
        """A context that makes `stream` (None, a torch stream or a cudaStream_t as int)
        the current one."""
        if stream is None or not self._comm.cuda:
            if stream not in (None, 0) and not self._comm.cuda:
                raise InvalidArgumentError(f"{self._name}: a stream on a host heap ({stream!r})")
            return contextlib.nullcontext()
        if isinstance(stream, int):
            stream = torch.cuda.ExternalStream(stream, device=self._comm.device)
        return torch.cuda.stream(stream)

    def _flat(self, t: torch.Tensor, numel: int, what: str) -> torch.Tensor:
        if not isinstance(t, torch.Tensor) or not t.is_contiguous():
            raise InvalidArgumentError(f"{self._name}: {what} must be a contiguous tensor")
        if t.numel() < numel:
            raise InvalidArgumentError(
                f"{self._name}: {what} has {t.numel()} elements, the call needs {numel}"
            )
        return t.view(-1)[:numel]

    def __call__(self, input_data, output_data, count: int, stream=None) -> bool:
        with self._on(stream):
            self._call(input_data, output_data, count)
        return True

    def start_async(self, input_data, output_data, count: int, stream=None) -> bool:
        """Enqueue the collective on ``stream``; :meth:`wait_async` orders a stream
        after it."""
        if self._pending is not None:
            raise InvalidArgumentError(f"{self._name}: an async call is in progress")
        t0 = time.perf_counter()
        with self._on(stream):
            self._call(input_data, output_data, count)
            event = None
            if self._comm.cuda:
                event = torch.cuda.Event()
                event.record()
        self._pending = (event, t0)
        return True

    def wait_async(self, stream=None) -> float:
        """Make ``stream`` (default: the current one) wait for the async call; returns
        the host seconds since :meth:`start_async`."""
        if self._pending is None:
            raise InvalidArgumentError(f"{self._name}: no async call in progress")
        event, t0 = self._pending
        self._pending = None
        if event is not None:
            with self._on(stream):
                torch.cuda.current_stream(self._comm.device).wait_event(event)
        return time.perf_counter() - t0

    def is_async_in_progress(self) -> bool:
        return self._pending is not None


class AllgatherSdma(_Sdma):
    """MORI's ``AllgatherSdma(my_pe, npes, input_buffer_size=None,
    output_buffer_size=None, transit_buffer_size=None, copy_output_to_user=True)``:
    ``obj(input, output, count, stream=None)`` gathers ``count`` elements of every pe's
    input into ``output`` (``npes * count`` elements, pe order)."""

    _name = "AllgatherSdma"

    def _max_bytes(self, input_size, output_size, transit_size) -> int:
        # MORI's transit buffer holds the gathered output.
        if input_size is None and transit_size is not None:
            return max(1, int(transit_size) // self.npes)
        return super()._max_bytes(input_size, output_size, transit_size)

    def _call(self, input_data, output_data, count: int) -> None:
        x = _as_signed(self._flat(input_data, count, "input_data"))
        out = _as_signed(self._flat(output_data, count * self.npes, "output_data"))
        self._comm.all_gather(x, out=out, algorithm=self._move_algorithm())


class All2allSdma(_Sdma):
    """MORI's ``All2allSdma(my_pe, npes, input_buffer_size=None, output_buffer_size=None,
    transit_buffer_size=None, copy_output_to_user=True)``: ``obj(input, output, count,
    stream=None)`` sends input chunk d (``count`` elements) to pe d; ``output`` chunk s
    is pe s's chunk for this pe. Returns the host seconds the call took to enqueue."""

    _name = "All2allSdma"

    def _call(self, input_data, output_data, count: int) -> None:
        x = _as_signed(self._flat(input_data, count * self.npes, "input_data"))
        out = _as_signed(self._flat(output_data, count * self.npes, "output_data"))
        self._comm.all_to_all(x, out=out, algorithm=self._move_algorithm())

    def __call__(self, input_data, output_data, count: int, stream=None) -> float:
        t0 = time.perf_counter()
        with self._on(stream):
            self._call(input_data, output_data, count)
        return time.perf_counter() - t0


class AllreduceSdma(_Sdma):
    """MORI's ``AllreduceSdma(my_pe, npes, input_buffer_size=None,
    output_buffer_size=None, transit_buffer_size=None, copy_output_to_user=True,
    dtype=torch.uint32, mode="eager")``: ``obj(input, output, count, stream=None)``
    sums ``count`` elements of ``dtype`` over the pes into ``output`` (one-shot up to
    1 MiB, two-shot above, as MORI chooses); ``allreduce_inplace(data, count)``."""

    _name = "AllreduceSdma"
    _ONESHOT_MAX_BYTES = 1 << 20

    def __init__(
        self,
        my_pe: int,
        npes: int,
        input_buffer_size: int | None = None,
        output_buffer_size: int | None = None,
        transit_buffer_size: int | None = None,
        copy_output_to_user: bool = True,
        dtype: torch.dtype = torch.uint32,
        mode: str = "eager",
    ):
        if dtype not in _ALLREDUCE_DTYPES:
            raise ValueError(f"Unsupported dtype {dtype}. Supported: {list(_ALLREDUCE_DTYPES)}")
        self.dtype = dtype
        self.mode = mode
        self._element_size = torch.empty((), dtype=dtype).element_size()
        super().__init__(
            my_pe,
            npes,
            input_buffer_size,
            output_buffer_size,
            transit_buffer_size,
            copy_output_to_user,
        )

    def _call(self, input_data, output_data, count: int) -> None:
        for t, what in ((input_data, "input_data"), (output_data, "output_data")):
            if isinstance(t, torch.Tensor) and t.dtype != self.dtype:
                raise InvalidArgumentError(f"AllreduceSdma of {self.dtype}: {what} is {t.dtype}")
        x = _as_signed(self._flat(input_data, count, "input_data"))
        out = _as_signed(self._flat(output_data, count, "output_data"))
        oneshot = count * self._element_size <= self._ONESHOT_MAX_BYTES
        self._comm.all_reduce(x, out=out, algorithm="one_shot" if oneshot else "two_shot")

    def allreduce_inplace(self, data, count: int, stream=None) -> bool:
        return self(data, data, count, stream)
