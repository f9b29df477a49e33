# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.ep: MoE expert-parallel dispatch and combine.

This release has the routing layout step (:func:`get_dispatch_layout`) on CPU and
CUDA; dispatch/combine kernels follow (see the package README).
"""

from __future__ import annotations

import mori.core  # noqa: F401  (loads libmori_core before the extension)

from . import _C  # noqa: F401  (the extension, for mori.ep._C users)
from ._version import __version__
from .layout import get_dispatch_layout

__all__ = ["__version__", "get_dispatch_layout"]
