# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""ROCm/mori's ``mori.ops.local_expert_count``: :mod:`mori.ep.local_expert_count`
under MORI's module name (``from mori.ops.local_expert_count import
launch_local_expert_count``)."""

from mori.ep.local_expert_count import launch_local_expert_count

__all__ = ["launch_local_expert_count"]
