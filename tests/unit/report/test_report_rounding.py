"""The report's one rounding rule: values with a CI keep the decimals the CI supports (PDG rule on
the half-width), values without one keep three significant digits."""

from __future__ import annotations

import pytest

from pipeline.report.view.rounding import (
    ci_decimals,
    fmt_ci,
    fmt_p,
    fmt_pct,
    fmt_value,
    invert_ci,
    sig_decimals,
    tidy_text,
)


@pytest.mark.parametrize("low, high, decimals", [
    (0.4301, 0.4788, 3),   # half-width 0.02435: leading digits 243 ≤ 354 → two digits (0.024)
    (0.40, 0.50, 2),       # 0.05: 500 → one digit (0.05)
    (0.30, 0.37, 3),       # 0.035: 350 → two digits (0.035)
    (0.20, 0.39, 2),       # 0.095: 950 → rounds up to 0.10, two digits (0.10)
    (-16.4, 123.0, 0),     # 69.7: one digit → tens, but never fewer than 0 decimals
    (1.0815, 1.0856, 4),   # 0.00205: two digits → 4 decimals
    (0.5, 0.5, None),      # degenerate: no width
])
def test_ci_decimals_follow_the_pdg_rule(low, high, decimals):
    assert ci_decimals(low, high) == decimals


def test_ci_decimals_are_capped():
    assert ci_decimals(1.0, 1.0 + 1e-9) == 4


def test_fmt_ci_rounds_point_and_bounds_alike():
    assert fmt_ci(0.4512, 0.4301, 0.4788)["text"] == "0.451 [0.430, 0.479]"
    assert fmt_ci(1.4667, 0.9123, 2.4567)["text"] == "1.5 [0.9, 2.5]"
    assert fmt_ci(53.12, -16.4, 123.0)["text"] == "53 [-16, 123]"


def test_fmt_ci_without_interval_keeps_three_significant_digits():
    assert fmt_ci(0.39924518, None, None)["text"] == "0.399 (no CI)"
    assert fmt_ci(0.5, 0.5, 0.5)["text"] == "0.500"  # degenerate CI: the point, no "(no CI)"
    assert fmt_ci(None, None, None)["text"] == "–"


@pytest.mark.parametrize("value, text", [
    (46.666666666666664, "46.7"), (0.0123456, "0.0123"), (1234.56, "1235"), (7.0, "7.00"),
    (0.0, "0"), (3, "3"), (None, "–"), (True, "yes"), (float("nan"), "–"), ("draft_target", "draft_target"),
])
def test_fmt_value(value, text):
    assert fmt_value(value) == text


def test_sig_decimals_never_drops_integer_digits():
    assert sig_decimals(98765.4) == 0 and sig_decimals(0.5) == 3


def test_percentages_and_p_values():
    assert fmt_pct(0.52834) == "52.8%" and fmt_pct(0.5) == "50%" and fmt_pct(0.051234) == "5.1%"
    assert fmt_pct(None) == "–"
    assert fmt_p(0.0039) == "0.0039" and fmt_p(3e-7) == "< 0.0001" and fmt_p(0.5123) == "0.51"


def test_invert_ci_swaps_the_bounds():
    point, low, high = invert_ci(0.5, 0.4, 0.625)
    assert (point, low, high) == (2.0, 1.6, 2.5)
    assert invert_ci(None, None, None) == (None, None, None)


def test_tidy_text_rounds_only_long_floats():
    assert tidy_text("mean OSL base 46.666666666666664 vs spec 48.0") == "mean OSL base 46.7 vs spec 48.0"
    assert tidy_text("ratio 0.4512345, p95 12.5 ms, run c1-r0, v2.13.0") == "ratio 0.451, p95 12.5 ms, run c1-r0, v2.13.0"
    assert tidy_text("created 2026-11-29T10:08:19.265290+00:00") == "created 2026-11-29T10:08:19.265290+00:00"
