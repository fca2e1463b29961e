"""Jinja rendering of the report pages (``report.html`` / ``report.md``, ``compare.html`` / ``compare.md``).

Reads the templates shipped in ``pipeline/report/view/templates/`` and a page model (display
strings, tables, base64 plots); returns the page text. Every format escapes what its template did
not write: HTML templates autoescape, and the Markdown ones escape every interpolated value
(:func:`md_escape`, Jinja's ``finalize``), so a config, category, prompt or model name can neither
inject markup nor break a table. Every template runs under ``StrictUndefined`` so a missing field
fails the render instead of printing nothing.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from pipeline.report.acceptance import NOT_REPORTED, PER_REQUEST
from pipeline.report.forecast_check import forecast_note, forecast_table
from pipeline.report.view import tables
from pipeline.report.view.summary import decision

ROUNDING_NOTE = ("Rounding: a value with a confidence interval is shown to the precision the interval supports "
                 "(its half-width keeps one or two significant digits, the Particle Data Group's rule, and the "
                 "point and bounds share those decimals); a value without one keeps three significant digits.")
CI_NOTE = ("spec/base ratios are the geometric mean over paired repeats of each repeat's ratio, speculative over "
           "baseline, with a paired t CI on the per-repeat log ratios (t, n-1 df; 1 - alpha/K per look with repeats: "
           "auto, docs/report.md); * marks a pooled request-level CI (fewer than two runs "
           "per arm), which is descriptive only. Green: the whole CI is on the better side of 1; red: on the worse side.")


# Every character that starts Markdown (CommonMark + GitHub: emphasis, code, links, HTML, tables,
# headings, strikethrough, math, entities) gets a backslash; CommonMark defines a backslash before
# any ASCII punctuation as that character, so the rendered text is unchanged. A "]" needs no
# escape once its "[" has one (no link or image can open).
_MD_SPECIAL = re.compile(r"([\\`*_\[<>|#~&$])")


class MdText(str):
    """Markdown a filter already escaped (or wrote): ``finalize`` leaves it as it is."""


def md_escape(value: Any) -> str:
    """Any interpolated value as literal Markdown text, on one line."""
    if isinstance(value, MdText):
        return value
    text = "" if value is None else str(value)
    return _MD_SPECIAL.sub(r"\\\1", text.replace("\r", " ").replace("\n", " "))


@lru_cache(maxsize=2)
def environment(markdown: bool = False):
    import jinja2  # noqa: PLC0415 - start-up: jinja2 (loaded when a page is rendered, not when the report is analysed)

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pipeline.report.view", "templates"),
        undefined=jinja2.StrictUndefined,
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.jinja",), default_for_string=False),
        finalize=md_escape if markdown else None,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["mdcell"] = md_cell
    env.filters["mdlines"] = md_lines
    env.filters["md"] = MdText  # a macro's output: Markdown the template wrote, its values escaped inside
    return env


def md_cell(text: Any) -> MdText:
    """A Markdown table cell: every markup character escaped (pipes too), line breaks joined."""
    return MdText(md_escape(text))


def md_lines(lines: list[Any]) -> MdText:
    """Lines in one table cell: each escaped, joined by the ``<br>`` this template writes."""
    return MdText("<br>".join(md_escape(line) for line in lines))


def report_page(data: dict, plots: dict[str, str | None]) -> dict[str, Any]:
    """Everything the report templates show, in the order they show it."""
    prov = data.get("provenance") or {}
    return {
        "name": data["name"],
        "meta": _meta_line(data, prov),
        "decision": decision(data),
        "plots": plots,
        "levels": tables.headline_tables(data),
        "schedule": tables.schedule_table(data),
        "categories": tables.category_table(data),
        "acceptance_cells": tables.acceptance_cells_table(data),
        "acceptance_sources": tables.acceptance_source_table(data),
        "acceptance_requests": tables.acceptance_request_table(data),
        "acceptance_positions": tables.acceptance_position_table(data),
        "acceptance_source": data.get("acceptance_source")
        or (PER_REQUEST if data.get("acceptance_rate") is not None else NOT_REPORTED),
        "gate": tables.gate_tables(data),
        "statistics": tables.statistics_table(data),
        "draft_lengths": tables.draft_length_table(data),
        "runs": tables.runs_table(data),
        "variability": tables.variability_table(data),
        "quality": tables.quality_table(data),
        "quality_issues": tables.quality_issues(data),
        "provenance": tables.provenance_rows(data),
        "formulas": list(data["formulas"].items()),
        "forecast": {"table": forecast_table(data), "note": forecast_note(data)},
        "notes": {"rounding": ROUNDING_NOTE, "ci": CI_NOTE},
    }


def _meta_line(data: dict, prov: dict) -> str:
    parts = [data["name"]]
    if prov.get("created"):
        parts.append(f"run {str(prov['created'])[:19].replace('T', ' ')} UTC")
    if prov.get("git_sha"):
        parts.append(f"git {str(prov['git_sha'])[:10]}")
    if prov.get("hardware", {}).get("declared") if isinstance(prov.get("hardware"), dict) else False:
        parts.append(f"hardware {prov['hardware']['declared']}")
    return " · ".join(parts)


def render(template: str, page: dict[str, Any]) -> str:
    return environment(template.endswith(".md.jinja")).get_template(template).render(**page)


def render_report(data: dict, plots: dict[str, str | None]) -> tuple[str, str]:
    """(report.md, report.html) text from the report data and its plots."""
    page = report_page(data, plots)
    return render("report.md.jinja", page), render("report.html.jinja", page)


def render_comparison(data_a: dict, data_b: dict, comp: dict, plot: str | None) -> tuple[str, str]:
    """(compare.md, compare.html) text: run B against run A."""
    from pipeline.report.view.compare import compare_page  # noqa: PLC0415 - start-up: pydantic (pipeline.report.view.compare; only a comparison page needs it)

    page = compare_page(comp, data_a, data_b, plot)
    return render("compare.md.jinja", page), render("compare.html.jinja", page)
