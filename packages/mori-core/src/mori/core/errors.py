# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The Python side of mori's error hierarchy.

Every extension translates a C++ ``mori::Error`` to the class registered here for
its code, so ``except mori.core.InvalidArgumentError`` catches the error whichever
extension raised it. Subclasses also derive from the matching builtin
(ValueError, TimeoutError, MemoryError, ...) so generic handlers keep working.
"""

from __future__ import annotations


class MoriError(RuntimeError):
    """Base of every error raised by mori. ``code`` is the native ErrorCode value."""

    code: int = 1


class InternalError(MoriError):
    """A broken invariant inside mori (a bug: please report it)."""

    code = 1


class InvalidArgumentError(MoriError, ValueError):
    """An argument was out of range, of the wrong type, shape or device."""

    code = 2


class OutOfMemoryError(MoriError, MemoryError):
    """A heap, pool or device ran out of memory."""

    code = 3


class MoriTimeoutError(MoriError, TimeoutError):
    """A bounded wait expired (a peer is slow, hung or gone)."""

    code = 4


class TransportError(MoriError, ConnectionError):
    """Moving bytes failed: a connection closed, a peer died, a NIC reported an error."""

    code = 5


class NotSupportedError(MoriError, NotImplementedError):
    """The operation is not available in this build or on this machine."""

    code = 6


class CudaError(MoriError):
    """A CUDA runtime or driver call failed."""

    code = 7


class InvalidStateError(MoriError):
    """The call is not valid in the current state (e.g. before init, after finalize)."""

    code = 8


class NotFoundError(MoriError, LookupError):
    """A named object (engine, memory region, peer) is not registered."""

    code = 9


_BY_CODE: dict[int, type[MoriError]] = {
    cls.code: cls
    for cls in (
        InternalError,
        InvalidArgumentError,
        OutOfMemoryError,
        MoriTimeoutError,
        TransportError,
        NotSupportedError,
        CudaError,
        InvalidStateError,
        NotFoundError,
    )
}


def error_class_for_code(code: int) -> type[MoriError]:
    """The MoriError subclass for a native ErrorCode value (MoriError if unknown)."""
    return _BY_CODE.get(int(code), MoriError)
