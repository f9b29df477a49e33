# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""``python -m mori.ep.bench``: see the package's docstring (``--help``)."""

from mori.ep.bench import main

main()
