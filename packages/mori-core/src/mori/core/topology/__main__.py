# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""``python -m mori.core.topology [--json]``: print this node's topology."""

from __future__ import annotations

import argparse
import json
import sys

from mori.core.topology import format_table, get_topology


def main(argv: list[str] | None = None) -> int:
    """Print the topology as tables, or as JSON with ``--json``; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m mori.core.topology",
        description="Show CPUs/NUMA nodes, CUDA GPUs and their links, NICs, and the NIC "
        "nearest each GPU.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument(
        "--no-gpus", action="store_true", help="skip CUDA/NVML discovery (sysfs only)"
    )
    args = parser.parse_args(argv)

    topo = get_topology(discover_gpus=not args.no_gpus)
    if args.json:
        json.dump(topo.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_table(topo))
    return 0


if __name__ == "__main__":
    sys.exit(main())
