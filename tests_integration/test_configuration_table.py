# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""docs/configuration.md lists every environment variable the libraries read, and
nothing else; every read goes through the one parser (mori/core/env.hpp, mori.core.env).

The libraries' code is read as text: a variable is any string literal that is exactly
a variable name (``"MORI_..."`` or torchrun's names), and a literal ending in ``_`` is
the prefix of a family (``MORI_LOG_LEVEL_<MODULE>``)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "configuration.md"
SUFFIXES = {".cpp", ".hpp", ".cu", ".cuh", ".h", ".py"}
LITERAL = re.compile(
    r"""["']((?:MORI_[A-Z0-9_]+)|RANK|WORLD_SIZE|LOCAL_RANK|MASTER_ADDR|MASTER_PORT)["']"""
)
# Literals spelled like variables that are not read from the environment: MORI's shmem
# init flag constants (mori.shmem exports them by name).
NOT_VARIABLES = {"MORI_SHMEM_INIT_WITH_UNIQUEID", "MORI_SHMEM_INIT_WITH_MPI_COMM"}
# The parser itself.
PARSER_FILES = {
    ROOT / "shared_native" / "src" / "core" / "env.cpp",
    ROOT / "packages" / "mori-core" / "src" / "mori" / "core" / "env.py",
}
RAW_CXX = re.compile(r"\bgetenv\s*\(")
RAW_PY = re.compile(r"os\.getenv\s*\(|os\.environ\.get\s*\(|os\.environ\[[^\]]+\](?!\s*=[^=])")


def _library_files() -> list[Path]:
    roots = [ROOT / "shared_native" / "src", ROOT / "shared_native" / "include"]
    for pkg in sorted((ROOT / "packages").iterdir()):
        roots += [pkg / "csrc", pkg / "src"]
    files = []
    for root in roots:
        files += [p for p in root.rglob("*") if p.suffix in SUFFIXES and p.is_file()]
    return sorted(files)


def _code_names() -> dict[str, list[str]]:
    names: dict[str, list[str]] = {}
    for path in _library_files():
        for name in LITERAL.findall(path.read_text(errors="replace")):
            if name not in NOT_VARIABLES:
                names.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return names


def _table_names() -> list[str]:
    text = DOC.read_text()
    section = text.split("## Variables", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([A-Z0-9_<>]+)` \|", section, flags=re.M)


def _as_code(name: str) -> str:
    """A table entry as the code spells it: a family `X_<Y>` is the prefix `X_`."""
    return name.split("<", 1)[0]


def test_table_lists_every_variable_once():
    table = _table_names()
    assert len(table) > 40, "the variable table was not found in docs/configuration.md"
    assert len(table) == len(set(table)), sorted({n for n in table if table.count(n) > 1})


def test_every_variable_the_code_reads_is_in_the_table():
    table = {_as_code(n) for n in _table_names()}
    missing = {n: where for n, where in _code_names().items() if n not in table}
    assert not missing, f"read by the code, missing from docs/configuration.md: {missing}"


def test_every_variable_in_the_table_is_read_by_some_code():
    code = set(_code_names())
    unread = [n for n in _table_names() if _as_code(n) not in code]
    assert not unread, f"listed in docs/configuration.md but read by no library code: {unread}"


def test_every_read_goes_through_the_parser():
    raw = []
    for path in _library_files():
        if path in PARSER_FILES:
            continue
        pattern = RAW_PY if path.suffix == ".py" else RAW_CXX
        for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            code = line.split("//", 1)[0] if path.suffix != ".py" else line.split("#", 1)[0]
            if pattern.search(code):
                raw.append(f"{path.relative_to(ROOT)}:{no}: {line.strip()}")
    assert not raw, "environment read outside mori::env / mori.core.env:\n" + "\n".join(raw)
