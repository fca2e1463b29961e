"""The README is a front door and every document the repository cites is in the repository.

Reads README.md, docs/*.md, locustfiles/README.md and every tracked text file's comments; writes
nothing. Links are checked as files, not as anchors."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# notes that lived outside the repository once; a citation must name upstream or a file here
OUTSIDE = re.compile(r"shared/reference|contract §|load-testing\.md|trtllm-build\.md|cpu-engine-notes|"
                     r"gpu-path-review|triton-repo-contract|code-review\.md")


def _tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    files = []
    for name in names:
        path = ROOT / name
        if path.suffix in {".py", ".md", ".yaml", ".yml", ".j2", ".pbtxt", ".txt", ".toml", ".sh"} and path.is_file():
            files.append(path)
    return files


def test_readme_is_a_front_door():
    assert (ROOT / "README.md").stat().st_size <= 10 * 1024


def test_every_relative_link_resolves():
    docs = [ROOT / "README.md", ROOT / "locustfiles" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = []
    for doc in docs:
        for target in LINK.findall(doc.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).exists():
                missing.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert missing == []


def test_no_reference_to_documents_outside_the_repository():
    found = []
    for path in _tracked_text_files():
        if path == Path(__file__).resolve():
            continue  # the pattern itself
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert found == []
