"""Rounding for the report: a number is shown to the precision its confidence interval supports.

Reads nothing, writes nothing: pure formatting used by every table and sentence of the report
pages. With an interval, the half-width is rounded to one or two significant digits by the
Particle Data Group's convention (Review of Particle Physics, "Rounding" in the introduction: the
three leading digits of the uncertainty 100–354 keep two digits, 355–949 one, 950–999 round up to
1000 and keep two) and the point and both bounds get the same number of decimals. Without an
interval (or a degenerate one) a value keeps three significant digits and never loses digits
left of the decimal point.
"""

from __future__ import annotations

import math
import re
from typing import Any

MISSING = "–"
SIGNIFICANT = 3
MAX_DECIMALS = 4


def ci_decimals(low: float, high: float, *, max_decimals: int = MAX_DECIMALS) -> int | None:
    """Decimals that the interval [low, high] supports; None when it has no width."""
    half = abs(high - low) / 2
    if not math.isfinite(half) or half == 0:
        return None
    exponent = math.floor(math.log10(half))
    leading = int(half / 10 ** (exponent - 2) + 1e-9)  # the three leading digits, 100..999
    if leading >= 950:
        exponent, digits = exponent + 1, 2
    else:
        digits = 2 if leading <= 354 else 1
    last_digit_exponent = exponent - digits + 1
    return max(0, min(max_decimals, -last_digit_exponent))


def sig_decimals(value: float, significant: int = SIGNIFICANT, *, max_decimals: int = MAX_DECIMALS) -> int:
    """Decimals that keep ``significant`` digits of ``value`` (none dropped left of the point)."""
    if value == 0 or not math.isfinite(value):
        return 0
    exponent = math.floor(math.log10(abs(value)))
    return max(0, min(max_decimals, significant - 1 - exponent))


def fmt_value(value: Any, significant: int = SIGNIFICANT) -> str:
    """A number without an interval: three significant digits; ints, bools and text as they are."""
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return MISSING
        return f"{value:.{sig_decimals(value, significant)}f}"
    return str(value)


def fmt_pct(fraction: float | None, significant: int = SIGNIFICANT) -> str:
    """A fraction as a percentage: three significant digits, at most one decimal (52.8%, 50%)."""
    if fraction is None or not math.isfinite(fraction):
        return MISSING
    pct = 100.0 * fraction
    text = f"{pct:.{min(1, sig_decimals(pct, significant))}f}"
    return (text[:-2] if text.endswith(".0") else text) + "%"


def fmt_p(p_value: float | None) -> str:
    """A test's p-value: two significant digits, ``< 0.0001`` below that."""
    if p_value is None or not math.isfinite(p_value):
        return MISSING
    return "< 0.0001" if p_value < 1e-4 else fmt_value(p_value, 2)


def fmt_ci(point: float | None, low: float | None, high: float | None) -> dict[str, str]:
    """Point and bounds rounded alike: ``{"point", "low", "high", "text"}`` (text: ``0.45 [0.43, 0.48]``)."""
    if point is None or not math.isfinite(point):
        return {"point": MISSING, "low": MISSING, "high": MISSING, "text": MISSING}
    decimals = ci_decimals(low, high) if low is not None and high is not None else None
    if decimals is None:
        text = fmt_value(float(point))
        no_ci = low is None or high is None
        return {"point": text, "low": MISSING, "high": MISSING, "text": text + (" (no CI)" if no_ci else "")}
    point_s, low_s, high_s = (f"{v:.{decimals}f}" for v in (point, low, high))
    return {"point": point_s, "low": low_s, "high": high_s, "text": f"{point_s} [{low_s}, {high_s}]"}


def invert_ci(point: float | None, low: float | None, high: float | None) -> tuple:
    """The interval of 1/x (a ratio turned into a speedup): bounds swap."""
    def inv(v):
        return 1.0 / v if v else None

    return inv(point), inv(high), inv(low)


_LONG_FLOAT = re.compile(r"(?<![\w.:])(-?\d+\.\d{4,})(?![\w.])")


def tidy_text(text: str) -> str:
    """Free text (a gate check's detail) with every long float rounded to three significant digits."""
    return _LONG_FLOAT.sub(lambda m: fmt_value(float(m.group(1))), text)
