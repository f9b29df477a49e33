# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The documentation stands on the repository alone: no file points outside it, no
document refers to work sessions or numbered issues, and every relative Markdown link
resolves. Needs git and the source tree, no build."""

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Built from parts so that this file does not match itself.
OUTSIDE = "../" + "shared/"
WORK_REFERENCE = re.compile(
    r"\b(issue|item) \d+\b|\b(first|second|third|fourth|fifth|last|this|next|previous) session\b",
    re.IGNORECASE,
)
# [text](target) and [text]: target; images too. Code spans and fenced blocks are
# removed before matching.
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout ({e})")
    return [ROOT / p for p in out.decode().split("\0") if p]


def _text(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except OSError:  # listed but deleted in the work tree
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _docs() -> list[Path]:
    return [p for p in _tracked() if p.suffix == ".md"]


def test_no_tracked_file_points_outside_the_repository():
    hits = []
    for path in _tracked():
        text = _text(path)
        if text is None:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if OUTSIDE in line:
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not hits, "files refer to a directory outside the repository:\n" + "\n".join(hits)


def test_docs_do_not_refer_to_work_sessions_or_issue_numbers():
    docs = _docs()
    assert docs, "no Markdown file tracked"
    hits = []
    for path in docs:
        text = _text(path) or ""
        for n, line in enumerate(text.splitlines(), 1):
            m = WORK_REFERENCE.search(line)
            if m:
                hits.append(f"{path.relative_to(ROOT)}:{n}: '{m.group(0)}' in: {line.strip()}")
    assert not hits, "documents refer to things outside the repository:\n" + "\n".join(hits)


def _links(text: str) -> list[str]:
    text = CODE_SPAN.sub("", FENCE.sub("", text))
    return INLINE_LINK.findall(text) + REFERENCE_LINK.findall(text)


def test_every_relative_markdown_link_resolves():
    broken = []
    checked = 0
    for path in _docs():
        text = _text(path) or ""
        for target in _links(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
                continue  # a URL (http:, mailto:, ...) or an anchor in the same file
            rel = unquote(target.split("#", 1)[0].split("?", 1)[0])
            if not rel:
                continue
            dest = (ROOT / rel.lstrip("/")) if rel.startswith("/") else (path.parent / rel)
            dest = dest.resolve()
            checked += 1
            if not dest.is_relative_to(ROOT) or not dest.exists():
                broken.append(f"{path.relative_to(ROOT)}: ({target})")
    assert checked > 0, "no relative link found: the link pattern is broken"
    assert not broken, "links that resolve to nothing in the repository:\n" + "\n".join(broken)


def test_the_link_check_sees_links():
    # Guards the pattern itself: a link in a code span is not a link, one outside is.
    text = "see [a](docs/a.md) and `[b](b.md)`\n```\n[c](c.md)\n```\n[d]: ref.md\n"
    assert sorted(_links(text)) == ["docs/a.md", "ref.md"]
