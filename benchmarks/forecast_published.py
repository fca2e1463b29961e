"""Published speculative-decoding results reproduced by the forecast from their reported inputs.

Reads ``pipeline/forecast/data/published.yaml``; writes ``benchmarks/results/forecast-published.json``
(command, commit, date, machine; per case: τ and its origin, the stack's per-step overhead, and per
batch the published and forecast speedup and the error). No measurement: the same inputs give the
same figures on any machine. Usage: ``python benchmarks/forecast_published.py``.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pipeline.infra.provenance import result_provenance  # noqa: E402 - after the path set-up above


def main() -> None:
    from pipeline.forecast.published import TOLERANCE, reproduce_all

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    cases = reproduce_all()
    out = {"what": "Published results reproduced by the forecast from their reported inputs (docs/forecast.md)",
           "provenance": result_provenance(), "command": " ".join(["python", *sys.argv]), "commit": commit.stdout.strip() or "unknown",
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"processor": platform.processor() or platform.machine(), "python": platform.python_version()},
           "tolerance": TOLERANCE, "reproduced": sum(1 for c in cases if c["reproduced"]), "cases": cases}
    path = ROOT / "benchmarks" / "results" / "forecast-published.json"
    path.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    for case in cases:
        for p in case["points"]:
            print(f"{case['id']} batch {p['batch']}: forecast {p['forecast_speedup']:.2f}x, published "
                  f"{p['published_speedup']:.2f}x, error {p['error']:+.0%}{' (fitted)' if p['fitted'] else ''}", file=sys.stderr)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
