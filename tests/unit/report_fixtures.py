"""Helpers for the report tests: a private copy of the committed fixture run, and a way to make
its speculative arm decode slower (a real change in the raw records, so every statistic follows)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "run_small"


def copy_fixture(target: Path) -> Path:
    shutil.copytree(FIXTURE, target)
    return target


def slow_down_speculative(run_dir: Path, factor: float, concurrency: int | None = None,
                          runs: str = "speculative-*") -> Path:
    """Stretch the decode phase (first token → last) of every request of the matching speculative
    runs (a glob over ``raw/`` run keys) by ``factor``."""
    for path in (run_dir / "raw").glob(f"{runs}.jsonl"):
        rows = []
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("t_first_token") and rec.get("t_last") and concurrency in (None, rec["concurrency"]):
                first = rec["t_first_token"]
                rec["t_last"] = int(first + (rec["t_last"] - first) * factor)
                rec["chunk_times"] = [int(first + (t - first) * factor) for t in rec["chunk_times"]]
            rows.append(json.dumps(rec))
        path.write_text("\n".join(rows) + "\n")
    return run_dir


def worsen_tail(run_dir: Path, factor: float, concurrency: int, share: float = 0.1,
                runs: str = "speculative-*") -> Path:
    """Stretch the decode phase of the slowest ``share`` of the requests (by E2E) of the matching
    speculative runs at ``concurrency`` by ``factor``: a worse E2E tail, the median untouched.

    A real closed-loop user would send its next request later; these edits overlap it instead, which
    raises the achieved concurrency, so the config snapshot's tolerance for that is widened."""
    for path in (run_dir / "raw").glob(f"{runs}.jsonl"):
        recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        timed = [r for r in recs if r.get("t_first_token") and r.get("t_last") and r.get("concurrency") == concurrency]
        timed.sort(key=lambda r: r["t_last"] - r["t_sent"], reverse=True)
        for rec in timed[:max(1, int(len(timed) * share))]:
            first = rec["t_first_token"]
            rec["t_last"] = int(first + (rec["t_last"] - first) * factor)
            rec["chunk_times"] = [int(first + (t - first) * factor) for t in rec["chunk_times"]]
        path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    meta_path = run_dir / "run.json"
    meta = json.loads(meta_path.read_text())
    meta["config"]["gate"]["achieved_concurrency_tolerance"] = 0.5
    meta_path.write_text(json.dumps(meta, indent=1))
    return run_dir
