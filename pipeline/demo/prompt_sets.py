"""Writes the demo prompt sets ``prompts/tiny/<category>.jsonl`` from held-out samples.

Reads nothing; each file holds ``count`` lines ``{"id", "category", "prompt"}`` — prefixes of
samples generated with the held-out seed (never the training seed), one file per category
including ``ood`` (deliberately unpredictable). The same call always writes the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.demo import corpus

PROMPTS_PER_CATEGORY = 60


def write_tiny_prompt_sets(out_dir: Path, count: int = PROMPTS_PER_CATEGORY) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for category in corpus.CATEGORIES:
        path = out_dir / f"{category}.jsonl"
        lines = [json.dumps(record, ensure_ascii=False) for record in corpus.prompts(category, count)]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        written.append(path)
    return written
