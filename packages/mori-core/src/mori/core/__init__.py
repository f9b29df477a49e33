# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.core: the native framework shared by mori.io, mori.ep and mori.ccl.

It loads libmori_core.so (one copy per process), maps native errors to the
MoriError hierarchy, and exposes logging, telemetry, topology and bootstrap.
"""

from __future__ import annotations

from pathlib import Path

from ._loader import load_native as _load_native
from ._version import __version__

_load_native()

from . import _C  # noqa: E402  (needs libmori_core loaded first)
from .errors import (  # noqa: E402
    CudaError,
    InternalError,
    InvalidArgumentError,
    InvalidStateError,
    MoriError,
    MoriTimeoutError,
    NotFoundError,
    NotSupportedError,
    OutOfMemoryError,
    TransportError,
)
from .log import get_log_level, set_log_level  # noqa: E402


def build_info() -> dict:
    """Describe the loaded libmori_core: version, CUDA support, visible devices."""
    return dict(_C.build_info())


def cmake_dir() -> str:
    """Directory holding mori_coreConfig.cmake, for ``-Dmori_core_DIR=...``."""
    return str(Path(__file__).resolve().parent / "lib" / "cmake" / "mori_core")


def include_dir() -> str:
    """Directory of mori-core's public C++ headers."""
    return str(Path(__file__).resolve().parent / "include")


def library_path() -> str:
    """Path of the libmori_core.so this package loaded."""
    from ._loader import LIBRARY_PATH

    return str(LIBRARY_PATH)


__all__ = [
    "CudaError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidStateError",
    "MoriError",
    "MoriTimeoutError",
    "NotFoundError",
    "NotSupportedError",
    "OutOfMemoryError",
    "TransportError",
    "__version__",
    "build_info",
    "cmake_dir",
    "get_log_level",
    "include_dir",
    "library_path",
    "set_log_level",
]
