# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
__version__ = "0.2.0"
