"""Every report format escapes what it did not write (issue 44.6): markup in a config name, a prompt
category, a prompt id or a model name reaches report.md / compare.md as literal text (rendered
here with markdown-it, the CommonMark parser rich already brings), report.html / compare.html as
escaped text, and report.json / compare.json stay valid JSON holding the names unchanged."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from pipeline.report.builder import make_comparison, make_report
from pipeline.report.view.render import md_cell, md_escape
from tests.unit.report_fixtures import copy_fixture

NAME = "evil.__bold__-x"  # what the config's name pattern allows: __bold__ is Markdown emphasis
CATEGORY = "chat|<script>alert(1)</script>*x*_y_ [link](http://evil.example) `code` # h ~~s~~ $m$ &amp;"
PROMPT_ID = "p|<img src=x onerror=alert(2)>"
MODEL = "builtin:<b>draft</b>|[m](http://evil.example)"


def _hostile_run(tmp_path: Path) -> Path:
    run_dir = copy_fixture(tmp_path / "run")
    meta = json.loads((run_dir / "run.json").read_text())
    meta["config"]["name"] = meta["name"] = NAME
    meta["draft_model"] = MODEL
    (run_dir / "run.json").write_text(json.dumps(meta))
    for path in (run_dir / "raw").glob("*.jsonl"):
        rows = []
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("category") == "chat":
                rec["category"] = CATEGORY
            if rec.get("prompt_id") == "chat-2":
                rec["prompt_id"] = PROMPT_ID
            rows.append(json.dumps(rec))
        path.write_text("\n".join(rows) + "\n")
    return run_dir


def _rendered(markdown: str) -> str:
    return MarkdownIt("commonmark").enable("table").enable("strikethrough").render(markdown)


def test_md_escape_leaves_no_markup():
    html = _rendered(md_escape(CATEGORY) + " " + md_escape(MODEL) + " " + md_escape(NAME))
    assert "<script" not in html and "<a " not in html and "<code>" not in html and "<strong>" not in html
    assert "<em>" not in html and "<s>" not in html and "<h1" not in html
    text = re.sub(r"<[^>]+>", "", html)  # the rendered text: what a reader sees
    assert CATEGORY.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in text
    # a hostile cell stays one cell: the pipe is escaped, a line break joined
    table = _rendered(f"| a | b |\n|---|---|\n| {md_cell('x|y')} | {md_cell('line1' + chr(10) + 'line2')} |\n")
    assert table.count("<td>") == 2 and "x|y" in table and "line1 line2" in table


@pytest.mark.slow  # renders two reports and a comparison of the fixture run
def test_every_report_format_escapes_hostile_names(tmp_path):
    run_dir = _hostile_run(tmp_path)
    report = make_report(run_dir)

    data = json.loads(report.json_path.read_text())  # valid JSON, names unchanged
    assert data["name"] == NAME and data["provenance"]["draft_model"] == MODEL
    assert any(CATEGORY in cell["acceptance_by_category"] for cell in data["cells"])

    md = report.md_path.read_text()
    html_of_md = _rendered(md)
    assert "<script" not in html_of_md and "<img" not in html_of_md and "<b>draft" not in html_of_md
    assert 'href="http://evil.example"' not in html_of_md
    assert "<strong>bold</strong>" not in html_of_md and "<em>x</em>" not in html_of_md
    assert "alert(1)" in html_of_md and "__bold__" in html_of_md  # the names are shown, as text
    # every table row keeps its header's column count: no name split a cell
    for block in md.split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln.startswith("|")]
        if len(lines) >= 2:
            widths = {len(re.findall(r"(?<!\\)\|", ln)) for ln in lines}
            assert len(widths) == 1, block

    html = report.html_path.read_text()
    assert "<script>alert(1)" not in html and "<b>draft</b>" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html

    # the comparison of this run with the fixture: both names and the categories on one page
    result = make_comparison(copy_fixture(tmp_path / "plain"), run_dir, tmp_path / "out")
    json.loads(result.json_path.read_text())
    compare_md = _rendered(result.md_path.read_text())
    assert "<script" not in compare_md and 'href="http://evil.example"' not in compare_md
    assert "alert(1)" in compare_md
    compare_html = result.html_path.read_text()
    assert "<script>alert(1)" not in compare_html and "<b>draft</b>" not in compare_html
