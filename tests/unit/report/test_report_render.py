"""Report files from the committed fixture run (tests/fixtures/run_small/), schema, self-contained
HTML, and the CLI's usage errors. The verdict → exit code mapping through the CLI (GO, NO-GO from
a --config gate, INCONCLUSIVE): tests/unit/cli/test_exit_codes.py; an acceptance gate's NO-GO:
test_gate.py::test_low_acceptance_is_no_go_where_the_config_makes_it_a_gate."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from pipeline.report.builder import REPORT_SCHEMA, make_report, validate_report_json
from tests.unit.cli_inproc import specdeploy

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "tests" / "fixtures" / "run_small"


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(FIXTURE, target)
    return target


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_report_files_and_schema(rendered: Path):
    data = json.loads((rendered / "report.json").read_text())
    assert data["schema"] == REPORT_SCHEMA
    assert validate_report_json(data) == []
    assert data["verdict"] == "GO"  # the fake servers: speculative halves TPOT at the same TTFT order
    arms = {(row["arm"], row["concurrency"]) for row in data["rows"]}
    assert arms == {("baseline", 1), ("baseline", 2), ("speculative", 1), ("speculative", 2)}
    spec = next(r for r in data["rows"] if r["arm"] == "speculative" and r["concurrency"] == 1)
    assert spec["speculation_length"] == 3 and spec["draft_model"] == "builtin:tiny-draft"
    assert spec["task_set"] == ["chat", "code", "math"]
    assert 0.5 < spec["acceptance_rate"] < 0.8  # fake server: 2 of 3 drafts accepted per full chunk
    assert spec["output_equivalent"] is True
    assert data["bootstrap"]["method"] == "percentile" and data["bootstrap"]["seed"] == 0  # pooled, descriptive
    assert data["intervals"]["method"].startswith("paired t") and data["intervals"]["confidence_level"] == 0.95
    assert data["repeats"] == {"mode": "fixed", "repeats": 3}
    assert data["comparisons"][0]["run_level"]["tpot_ratio"]["n_pairs"] == 3
    assert data["provenance"]["config_hash"] and data["provenance"]["dataset"]["sha256"]
    assert "TPOT" in data["formulas"] and "CHUNK" in data["formulas"]["inter-chunk latency"]


@pytest.mark.budget(4)  # the first quick test of this module pays its report (seven figures since issue 42)
def test_report_md_has_verdict_and_tables(rendered: Path):
    md = (rendered / "report.md").read_text()
    assert md.startswith("# GO: Roll out speculative decoding (draft\\_target, K=3)\n")  # Markdown-escaped name
    # the fake servers: speculation pays at both levels, no tail worse with confidence (rollout_range.py)
    assert ("**Recommended rollout: enable at every measured concurrency (up to 2); no crossover was found, so measure "
            "higher before running above 2") in md
    assert "### Concurrency 1 (gated)" in md
    # independent of the report code: the fixture's fake servers stream a token every 8 ms (baseline)
    # and three every 12 ms (speculative), so TPOT is 8 and 4 ms and their ratio 0.5, give or take
    # what the client's clock adds per chunk
    row = re.search(r"^\| TPOT p50 \(ms\) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \\\[([\d.]+), ([\d.]+)\] \|",
                    md, re.MULTILINE)
    base, spec, ratio, low, high = map(float, row.groups())
    assert base == pytest.approx(8.0, rel=0.05) and spec == pytest.approx(4.0, rel=0.05)
    assert ratio == pytest.approx(spec / base, abs=0.01) and low <= ratio <= high
    assert ratio == pytest.approx(0.5, rel=0.05)
    assert "## Acceptance and speedup by category" in md and "### Formulas" in md


SECTIONS = ("verdict-banner", "per-concurrency", "categories", "gate", "statistics", "runs", "data-quality",
            "provenance", "formulas")


def test_html_and_md_put_the_decision_first_in_the_same_order(rendered: Path):
    html = (rendered / "report.html").read_text()
    positions = [html.index(f'id="{section}"') for section in SECTIONS]
    assert positions == sorted(positions)
    md = (rendered / "report.md").read_text()
    headings = ["# GO:", "## Per concurrency", "## Acceptance and speedup by category", "### Gate checks",
                "### Speculative vs baseline", "### Runs", "### Data quality", "### Provenance", "### Formulas"]
    md_positions = [md.index(h) for h in headings]
    assert md_positions == sorted(md_positions)
    # the headline plots sit in the first section, next to the banner, before any table
    first_img, first_table = html.index("<img "), html.index("<table")
    assert html.index('id="verdict-banner"') < first_img < first_table
    assert html.count("<img ", 0, first_table) == 2


class _Text(HTMLParser):
    """The text a reader sees (no <style>, no attribute values such as data: URIs)."""

    def __init__(self):
        super().__init__()
        self.parts, self._skip = [], False

    def handle_starttag(self, tag, attrs):
        self._skip = tag == "style"
        if tag in ("p", "li", "tr", "h1", "h2", "h3", "dt", "dd", "summary", "br", "div"):
            self.parts.append("\n")
        elif tag in ("td", "th"):
            self.parts.append("\t")

    def handle_endtag(self, tag):
        self._skip = False

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def page_text(html: str) -> str:
    parser = _Text()
    parser.feed(html)
    return "".join(parser.parts)


MARKDOWN = re.compile(r"\*\*|__|`|^\s*#{1,6} |^\s*> |^\s*\|.*\||\|---|\]\(", re.M)


def test_html_shows_no_markdown_and_no_unrounded_number(rendered: Path):
    text = page_text((rendered / "report.html").read_text())
    assert "Roll out speculative decoding" in text
    assert not MARKDOWN.search(text), MARKDOWN.search(text)
    unrounded = re.findall(r"(?<![\d:])\d+\.\d{5,}", text)  # a clock time's seconds excepted
    assert not unrounded, unrounded


def test_html_is_self_contained(rendered: Path):
    html = (rendered / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>")
    assert "<script" not in html and "<link" not in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert not re.search(r"url\(\s*['\"]?https?:", html)
    images = re.findall(r'<img [^>]*src="([^"]+)"', html)
    assert len(images) == 7 and all(src.startswith("data:image/png;base64,") for src in images)
    from PIL import Image

    for src in images:
        with Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))) as img:
            assert img.format == "PNG" and img.width > 300 and img.height > 150
    assert "@media print" in html and "@media (max-width" in html and 'name="viewport"' in html


def test_reported_percentiles_equal_numpy_on_raw_records(rendered: Path):
    import numpy as np

    data = json.loads((rendered / "report.json").read_text())
    records = []
    for path in sorted((rendered / "raw").glob("baseline-c1-r*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    ttft = [(r["t_first_token"] - r["t_sent"]) / 1e6 for r in records if r["stage"] == "measure" and r["status"] == "ok"]
    cell = next(c for c in data["cells"] if c["arm"] == "baseline" and c["concurrency"] == 1)
    assert cell["ttft_ms"]["p95"] == pytest.approx(float(np.percentile(ttft, 95)))
    assert cell["ttft_ms"]["p50"] == pytest.approx(float(np.percentile(ttft, 50)))


@pytest.mark.slow
def test_console_script_exit_codes(tmp_path: Path):
    # the console script's main in this process: what it prints and returns (the entry point as a
    # process: test_cli_help.py::test_the_entry_point_runs_as_a_process); its INCONCLUSIVE report
    # (3, "INCONCLUSIVE" printed) is test_exit_codes.py::test_report_returns_each_verdicts_code
    usage = specdeploy("report")
    assert usage.returncode == 2
    missing = specdeploy("report", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such run directory" in missing.stderr
    assert "Traceback" not in missing.stderr


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_dead_server_run_is_never_go(run_dir: Path):
    listing = json.loads((run_dir / "runs.json").read_text())
    listing["runs"][-1].update({"server_alive": False, "valid": False, "invalid_reasons": ["server not alive"]})
    (run_dir / "runs.json").write_text(json.dumps(listing))
    report = make_report(run_dir)
    assert report.verdict == "NO-GO" and report.exit_code == 1
    assert any("server died" in r for r in report.data["reasons"])


def test_recommended_draft_length_per_concurrency():
    from pipeline.report.builder import recommend_draft_len

    def comp(level, k, low, high, point):
        ci = {"low": low, "high": high, "point": point}
        return {"concurrency": level, "draft_len": k, "run_level": {"tpot_ratio": ci},
                "pooled_request_level": {"tpot_ratio_of_medians": ci}}

    comps = [comp(1, 2, 0.6, 0.7, 0.65), comp(1, 4, 0.4, 0.5, 0.45), comp(1, 8, 0.5, 0.6, 0.55),
             comp(16, 2, 0.9, 0.99, 0.95), comp(16, 4, 1.0, 1.2, 1.1)]
    rec = recommend_draft_len(comps)
    assert rec["1"]["draft_len"] == 4 and rec["1"]["speculation"] == "on"
    assert rec["16"]["draft_len"] == 2
    worse = recommend_draft_len([comp(32, 2, 1.0, 1.1, 1.05), comp(32, 4, 1.1, 1.3, 1.2)])
    assert worse["32"]["draft_len"] is None and worse["32"]["speculation"] == "off"


def test_tau_bound():
    from pipeline.report.builder import tau_bound

    assert tau_bound(0.5, 3) == pytest.approx((1 - 0.5 ** 4) / 0.5)
    assert tau_bound(1.0, 4) == 5.0 and tau_bound(None, 4) is None and tau_bound(0.0, 4) == 1.0
