# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Symmetric memory with an OpenSHMEM-style host API.

Every pe (process) of a group owns a heap of the same size; ``malloc`` returns
the same offset on every pe, so a buffer has one address per pe and a pe can load
and store into the copies of the pes on its node. Host heaps live in one shared
memory mapping per node (every protocol runs without a GPU); CUDA heaps are
cuMem allocations shared through fabric or POSIX-fd handles and mapped into each
peer, for kernels (device API: ``mori/shmem/device.cuh``).

Typical use (under torchrun, after ``torch.distributed.init_process_group``)::

    from mori.core import shmem
    shmem.init(heap_size="256M")               # device: current CUDA device, or host
    x = shmem.empty((1024,), torch.float32)    # symmetric tensor
    peer = shmem.peer_view(x, (shmem.my_pe() + 1) % shmem.n_pes())
    shmem.barrier_all()
    shmem.finalize()

Addresses are integers (``tensor.data_ptr()``); tensors are accepted wherever an
address is, and symmetric tensors are made with :func:`empty`.
"""

from __future__ import annotations

from typing import Any

from . import _C
from .errors import InvalidArgumentError

_DLPACK_CODES = {}


def _dlpack_code(dtype) -> tuple[int, int]:
    import torch

    if not _DLPACK_CODES:
        for dt, code in (
            (torch.float16, 2),
            (torch.float32, 2),
            (torch.float64, 2),
            (torch.bfloat16, 4),
            (torch.int8, 0),
            (torch.int16, 0),
            (torch.int32, 0),
            (torch.int64, 0),
            (torch.uint8, 1),
            (torch.uint16, 1),
            (torch.uint32, 1),
            (torch.uint64, 1),
            (torch.bool, 6),
        ):
            _DLPACK_CODES[dt] = (code, dt.itemsize * 8)
    try:
        return _DLPACK_CODES[dtype]
    except KeyError:
        raise InvalidArgumentError(
            f"dtype {dtype} cannot back a symmetric tensor (use a uint8 view for fp8)"
        ) from None


def _addr(x) -> int:
    """Address of a tensor (its first element) or an int address."""
    if isinstance(x, int):
        return x
    if hasattr(x, "data_ptr"):
        return int(x.data_ptr())
    raise InvalidArgumentError(f"expected a tensor or an int address, got {type(x).__name__}")


def _nbytes(t) -> int:
    if not t.is_contiguous():
        raise InvalidArgumentError(
            f"tensor (shape {tuple(t.shape)}, strides {t.stride()}) must be contiguous"
        )
    return t.numel() * t.element_size()


def _check_device(x, what: str) -> None:
    """Refuse a tensor whose memory the heap's host-side copy cannot reach: no
    memory at all (meta), or device memory when the heap is in host memory."""
    device = getattr(x, "device", None)
    kind = getattr(device, "type", "cpu")
    if kind == "cpu":
        return
    desc = f"a tensor on device {device} (shape {tuple(x.shape)}, {x.dtype})"
    if kind == "meta":
        raise InvalidArgumentError(f"{what}: {desc} has no memory to copy")
    if not _C.shmem_initialized():
        return  # the native call reports that
    heap = _C.shmem_info()["kind"]
    if heap == "cuda" and kind == "cuda":
        return
    raise InvalidArgumentError(
        f"{what}: {desc} is not reachable by the host-side copy of this {heap} heap "
        f"(use a {'CPU or CUDA' if heap == 'cuda' else 'CPU'} tensor)"
    )


def init(
    group: Any = None,
    device: Any = None,
    heap_size: int | str | None = None,
    bootstrap: Any = None,
    handle: str | None = None,
    timeout_s: float = 120.0,
) -> None:
    """Create the symmetric heap; collective over the group.

    Args:
        group: torch.distributed ProcessGroup to bootstrap over (the default group
            if torch.distributed is initialized); ignored when ``bootstrap`` is given.
        device: ``"cpu"`` for a host heap, a CUDA device (int, ``"cuda:1"``,
            torch.device) for a CUDA heap. None: the current CUDA device when torch
            sees one, else a host heap.
        heap_size: bytes per pe (int or "512M"/"2G"); None reads MORI_SHMEM_HEAP_SIZE
            (default 1 GiB). Rounded up to 2 MiB.
        bootstrap: a mori.core.bootstrap object (TcpBootstrap, TorchBootstrap, ...);
            default: :func:`mori.core.bootstrap.default_bootstrap`.
        handle: CUDA heaps: "auto" (fabric, else POSIX fd), "fabric" or "posix_fd";
            None reads MORI_SHMEM_HANDLE.
        timeout_s: bound on every collective wait.

    Raises:
        InvalidStateError: already initialized.
    """
    from .bootstrap import default_bootstrap

    if _C.shmem_initialized():
        from .errors import InvalidStateError

        raise InvalidStateError("mori shmem is already initialized; call finalize() first")
    ordinal = _device_ordinal(device)
    if isinstance(heap_size, str):
        from ._C import shmem_parse_size

        heap_size = shmem_parse_size(heap_size)
    if heap_size is not None and not 0 <= int(heap_size) < 2**64:
        raise InvalidArgumentError(f"heap_size {heap_size} bytes is out of range [0, 2**64)")
    boot = bootstrap if bootstrap is not None else default_bootstrap(group)
    _C.shmem_init(boot, int(heap_size or 0), ordinal, handle or "", float(timeout_s))


def _device_ordinal(device: Any) -> int:
    if device is None:
        try:
            import torch

            if torch.cuda.is_available():
                return torch.cuda.current_device()
        except ImportError:
            pass
        return -1
    if isinstance(device, int):
        return device
    text = str(device)
    if text == "cpu":
        return -1
    if text == "cuda":
        import torch

        return torch.cuda.current_device()
    if text.startswith("cuda:"):
        return int(text.split(":", 1)[1])
    raise InvalidArgumentError(f"device {device!r} is not 'cpu', 'cuda', 'cuda:N' or an int")


def finalize(force: bool = False) -> None:
    """Destroy the heap; collective. Raises InvalidStateError (on every pe) while
    any pe has live allocations, unless ``force`` (then those buffers dangle)."""
    _C.shmem_finalize(force)


def initialized() -> bool:
    """Whether the heap exists in this process."""
    return _C.shmem_initialized()


def my_pe() -> int:
    """This process's pe number."""
    return _C.shmem_my_pe()


def n_pes() -> int:
    """Number of pes."""
    return _C.shmem_n_pes()


def info() -> dict:
    """kind ("host"/"cuda"), device, handle_type, handle_notes, heap_size,
    used_bytes, free_bytes, largest_free_block, live_allocations, local_pes."""
    return dict(_C.shmem_info())


def malloc(nbytes: int, align: int = 256) -> int:
    """Collective: a symmetric block of ``nbytes``; returns its address.

    Every pe must pass the same sizes in the same order; a mismatch or an
    exhausted heap raises on every pe (InvalidArgumentError / OutOfMemoryError)."""
    return _C.shmem_malloc(int(nbytes), int(align))


def free(ptr) -> None:
    """Local: release a block from :func:`malloc` or :func:`empty` (address or
    tensor). A tensor from :func:`empty` freed here no longer owns its block: its
    collection frees nothing, and the tensor must not be used afterwards. Double
    frees and foreign pointers raise InvalidArgumentError naming the address."""
    _C.shmem_free(_addr(ptr))


def empty(shape, dtype) -> Any:
    """Collective: an uninitialized symmetric tensor of ``shape`` and ``dtype`` on
    the heap's device (torch.Tensor through DLPack). Its memory is freed when the
    tensor is garbage collected."""
    import torch

    shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise InvalidArgumentError(f"negative dimension in shape {shape}")
    code, bits = _dlpack_code(dtype)
    numel = 1
    for s in shape:
        numel *= s
    nbytes = max(numel * bits // 8, 1)
    ptr = malloc(nbytes, 256)
    try:
        cap = _C.shmem_dlpack(ptr, list(shape), code, bits, True)
    except BaseException:
        free(ptr)
        raise
    return torch.from_dlpack(cap)


def peer_view(tensor, pe: int) -> Any:
    """A tensor viewing ``pe``'s copy of symmetric ``tensor`` (same shape/dtype).

    Raises NotSupportedError when ``pe`` is not load/store reachable (another
    node). The view keeps ``tensor`` alive; it is valid until the heap is finalized."""
    import torch

    remote = _C.shmem_ptr(_addr(tensor), int(pe))
    if remote == 0:
        from .errors import NotSupportedError

        raise NotSupportedError(
            f"pe {pe} is not load/store reachable from pe {my_pe()} (another node)"
        )
    code, bits = _dlpack_code(tensor.dtype)
    if not tensor.is_contiguous():
        raise InvalidArgumentError("peer_view needs a contiguous symmetric tensor")
    if not _C.shmem_is_symmetric(_addr(tensor), max(_nbytes(tensor), 1)):
        raise InvalidArgumentError("peer_view: tensor is not in the symmetric heap")
    view = torch.from_dlpack(_C.shmem_dlpack(remote, list(tensor.shape), code, bits, False))
    view._mori_base = tensor
    return view


def ptr(addr, pe: int) -> int:
    """``pe``'s address of symmetric ``addr`` (int or tensor); 0 when unreachable."""
    return _C.shmem_ptr(_addr(addr), int(pe))


def barrier_all() -> None:
    """Host barrier over all pes (signals in the heap when every pe is on this
    node, the bootstrap otherwise). Orders heap accesses before and after it."""
    _C.shmem_barrier_all()


def barrier_on_stream(stream: Any = None) -> None:
    """Enqueue a device barrier over all pes on ``stream`` (torch.cuda.Stream, raw
    handle int, or None for torch's current stream). Capturable in CUDA graphs.
    CUDA heaps only."""
    if stream is None:
        import torch

        stream = torch.cuda.current_stream().cuda_stream
    elif hasattr(stream, "cuda_stream"):
        stream = stream.cuda_stream
    _C.shmem_barrier_on_stream(int(stream))


def put(dst, src, pe: int) -> None:
    """Copy ``src`` (a CPU tensor; a CPU or CUDA one for CUDA heaps) into ``pe``'s
    copy of symmetric ``dst``. Tensors on other devices (meta, ...) raise
    InvalidArgumentError naming the device and shape."""
    _check_device(src, "put source")
    _check_device(dst, "put destination")
    n = _nbytes(src)
    if not isinstance(dst, int) and n > _nbytes(dst):
        raise InvalidArgumentError(f"put of {n} bytes into a {_nbytes(dst)}-byte destination")
    _C.shmem_put(_addr(dst), _addr(src), n, int(pe))


def get(dst, src, pe: int) -> None:
    """Copy ``pe``'s copy of symmetric ``src`` into ``dst`` (a CPU tensor; a CPU or
    CUDA one for CUDA heaps). Other devices raise as in :func:`put`."""
    _check_device(dst, "get destination")
    _check_device(src, "get source")
    n = _nbytes(dst)
    if not isinstance(src, int) and n > _nbytes(src):
        raise InvalidArgumentError(f"get of {n} bytes from a {_nbytes(src)}-byte source")
    _C.shmem_get(_addr(dst), _addr(src), n, int(pe))


def signal(sig, value: int, pe: int, op: str = "set") -> None:
    """Set or add ``value`` to ``pe``'s copy of the 64-bit symmetric word ``sig``
    with release semantics (earlier puts are visible to whoever sees the value)."""
    _C.shmem_signal(_addr(sig), int(value), int(pe), op)


def wait_until(sig, cmp: str, value: int, timeout_s: float = 60.0) -> int:
    """Wait until this pe's copy of ``sig`` compares (eq/ne/gt/ge/lt/le) with
    ``value``; acquire semantics. Returns the value seen; MoriTimeoutError after
    ``timeout_s``."""
    return _C.shmem_wait_until(_addr(sig), cmp, int(value), float(timeout_s))


__all__ = [
    "barrier_all",
    "barrier_on_stream",
    "empty",
    "finalize",
    "free",
    "get",
    "info",
    "init",
    "initialized",
    "malloc",
    "my_pe",
    "n_pes",
    "peer_view",
    "ptr",
    "put",
    "signal",
    "wait_until",
]
