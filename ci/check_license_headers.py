# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""pre-commit hook: every source file starts with the SPDX line and the copyright
line (after a shebang, if any)."""

from __future__ import annotations

import sys
from pathlib import Path

SPDX = "SPDX-License-Identifier: MIT"
COPYRIGHT = "Copyright (c) 2026 The mori authors"


def check(path: Path) -> str | None:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()[:4]
    except UnicodeDecodeError:
        return None
    if lines and lines[0].startswith("#!"):
        lines = lines[1:]
    head = "\n".join(lines[:2])
    if SPDX not in head or COPYRIGHT.split(" 2026 ")[0] not in head:
        return f"{path}: missing license header ('{SPDX}' and '{COPYRIGHT}' in the first lines)"
    return None


def main(argv: list[str]) -> int:
    problems = [p for p in (check(Path(a)) for a in argv) if p]
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
