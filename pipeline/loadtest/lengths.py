"""Input and output lengths: drawn from a distribution, or the dataset's own, with prompts cut
from real text to the drawn length in the target's tokenizer (never random token ids: acceptance
depends on the tokens, vllm#52536).

A length is written the same way as a flag (``--input-len``/``--output-len``) and in YAML
(``loadtest.input_len``/``output_len``)::

    128                       fixed
    64:256                    uniform integers in [64, 256] (also ``uniform:64:256``)
    normal:512,128            normal with mean 512 and standard deviation 128, bounded to [1, ∞)
    normal:512,128,256,1024   … bounded to [256, 1024]
    lognormal:200,150,16,1024 lognormal whose lengths have mean 200 and sd 150, bounded
    dataset                   the dataset's own (a trace's lengths, the recorded answer's tokens)

Bounded distributions are truncated, not clipped (``scipy.stats.truncnorm``; the lognormal as a
truncated normal of the log), so no length piles up at a bound. Draws are seeded and made once
per run, so both arms get identical prompts and ``max_tokens``.

Reads the tokenizer's ``tokenizer.json``; writes nothing.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from pipeline.errors import UsageError

KINDS = ("fixed", "uniform", "normal", "lognormal", "dataset")


@dataclass(frozen=True)
class LengthDistribution:
    kind: str
    value: int | None = None  # fixed
    low: int = 1  # uniform bounds, and the truncation bounds of normal/lognormal
    high: int | None = None
    mean: float | None = None
    stddev: float | None = None

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"fixed {self.value}"
        if self.kind == "uniform":
            return f"uniform [{self.low}, {self.high}]"
        if self.kind == "dataset":
            return "the dataset's own"
        bounds = f"[{self.low}, {self.high if self.high is not None else '∞'}]"
        return f"{self.kind} mean {self.mean:g} sd {self.stddev:g} within {bounds}"


def parse_length(text: Any, option: str = "--input-len") -> LengthDistribution:
    """A length written as in the module docstring; a usage error naming ``option`` otherwise."""
    if isinstance(text, LengthDistribution):
        return text
    if isinstance(text, bool):
        raise UsageError(f"{option}: expected a length like 128, 64:256, normal:512,128 or dataset, got {text!r}")
    if isinstance(text, int):
        text = str(text)
    if not isinstance(text, str):
        raise UsageError(f"{option}: expected a length like 128, 64:256, normal:512,128 or dataset, got {text!r}")
    s = text.strip().lower().replace(" ", "")
    try:
        if s == "dataset":
            return LengthDistribution("dataset")
        if re.fullmatch(r"\d+", s):
            return _checked(LengthDistribution("fixed", value=int(s)), option, text)
        match = re.fullmatch(r"(?:uniform:)?(\d+):(\d+)", s)
        if match:
            return _checked(LengthDistribution("uniform", low=int(match.group(1)), high=int(match.group(2))), option, text)
        match = re.fullmatch(r"(normal|lognormal):([^,]+),([^,]+)(?:,(\d+),(\d+))?", s)
        if match:
            kind, mean, sd, low, high = match.groups()
            spec = LengthDistribution(kind, mean=float(mean), stddev=float(sd), low=int(low) if low else 1,
                              high=int(high) if high else None)
            return _checked(spec, option, text)
    except ValueError:
        pass
    raise UsageError(f"{option}: '{text}' is not a length: 128 (fixed), 64:256 (uniform), normal:MEAN,SD[,MIN,MAX], "
                     "lognormal:MEAN,SD[,MIN,MAX] or dataset")


def _checked(spec: LengthDistribution, option: str, text: str) -> LengthDistribution:
    problem = None
    if spec.kind == "fixed" and spec.value < 1:
        problem = "a length must be at least 1"
    elif spec.low < 1 or (spec.high is not None and spec.high < spec.low):
        problem = f"bounds [{spec.low}, {spec.high}] must satisfy 1 <= MIN <= MAX"
    elif spec.kind in ("normal", "lognormal"):
        if not (spec.mean > 0 and spec.stddev > 0 and math.isfinite(spec.mean) and math.isfinite(spec.stddev)):
            problem = "MEAN and SD must be positive numbers"
        elif spec.high is not None and not spec.low <= spec.mean <= spec.high:
            problem = f"MEAN {spec.mean:g} lies outside [{spec.low}, {spec.high}]"
    if problem:
        raise UsageError(f"{option}: '{text}': {problem}")
    return spec


def draw(spec: LengthDistribution, n: int, rng: np.random.Generator) -> list[int]:
    """``n`` integer lengths from ``spec`` (not ``dataset``), every one within its bounds."""
    if spec.kind == "fixed":
        return [int(spec.value)] * n
    if spec.kind == "uniform":
        return [int(v) for v in rng.integers(spec.low, spec.high, size=n, endpoint=True)]
    from scipy.stats import truncnorm  # noqa: PLC0415 - start-up: scipy (pipeline.config imports this module for its length syntax; scipy loads when lengths are drawn)

    low, high = spec.low - 0.5, (spec.high + 0.5) if spec.high is not None else math.inf
    if spec.kind == "normal":
        loc, scale = spec.mean, spec.stddev
    else:  # lognormal: the normal of log(length) whose exponential has this mean and sd
        sigma2 = math.log1p((spec.stddev / spec.mean) ** 2)
        loc, scale = math.log(spec.mean) - sigma2 / 2, math.sqrt(sigma2)
        low, high = math.log(low), math.log(high)
    values = truncnorm.rvs((low - loc) / scale, (high - loc) / scale, loc=loc, scale=scale, size=n, random_state=rng)
    if spec.kind == "lognormal":
        values = np.exp(values)
    top = spec.high if spec.high is not None else math.inf
    return [int(min(max(round(float(v)), spec.low), top)) for v in values]


# ------------------------------------------------------------------------------------------------
# Cutting real text to a token length


class TextCutter:
    """Cuts text to an exact number of tokens of ``tokenizer.json``; a prompt shorter than asked
    is continued with the rest of ``corpus`` (the other prompts, in order), so the text stays real."""

    def __init__(self, tokenizer_json: Path, corpus: Sequence[str]):
        from tokenizers import Tokenizer  # noqa: PLC0415 - start-up: tokenizers (pipeline.config imports this module for its length syntax; tokenizers loads when lengths are drawn)

        self.tokenizer = Tokenizer.from_file(str(tokenizer_json))
        self.corpus = [t for t in corpus if t.strip()]

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def cut(self, text: str, n: int, more: Iterable[str] | None = None) -> tuple[str, int, bool]:
        """(text of ``n`` tokens, its token count, whether other text was appended). A text shorter
        than ``n`` tokens is continued with ``more`` (default: the corpus), in order. The count
        differs from ``n`` only where no cut re-tokenizes to exactly ``n`` tokens (a merge across
        the cut): the nearest shorter cut is kept and its count recorded."""
        more = iter(self.corpus if more is None else more)
        extended = False
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        while len(encoding.ids) < n:
            following = next((t for t in more if t.strip()), None)
            if following is None:
                raise UsageError(f"--input-len: {n} tokens asked, but the text available has only "
                                 f"{len(encoding.ids)}: use shorter lengths or a larger dataset")
            text = f"{text}\n\n{following}" if text.strip() else following
            extended = True
            encoding = self.tokenizer.encode(text, add_special_tokens=False)
        return (*self._exact(text, encoding.offsets, n), extended)

    def _exact(self, text: str, offsets: list[tuple[int, int]], n: int) -> tuple[str, int]:
        best: tuple[str, int] | None = None
        for m in _near(n, len(offsets)):
            candidate = text[:offsets[m - 1][1]]
            count = self.count(candidate)
            if count == n:
                return candidate, n
            if count < n and (best is None or count > best[1]):
                best = (candidate, count)
        return best if best is not None else (text[:offsets[0][1]], self.count(text[:offsets[0][1]]))


def _near(n: int, limit: int, spread: int = 8) -> list[int]:
    """n, n-1, n+1, n-2, … within [1, limit]: the token positions a cut is tried after."""
    out = [n]
    for d in range(1, spread + 1):
        out += [n - d, n + d]
    return [m for m in out if 1 <= m <= limit]


def apply_lengths(prompts: list[dict[str, Any]], *, input_len: LengthDistribution | None, output_len: LengthDistribution | None,
                  default_max_tokens: int, seed: int, cutter_factory: Callable[[], TextCutter] | None,
                  category_texts: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """Set each prompt's text to its input length and its ``max_tokens`` to its output length,
    in place; returns what the run records about it (the specs, the lengths drawn, what was cut).

    ``category_texts``: each category's texts in the dataset (what a short prompt is continued with).
    ``input_len`` None: prompts as written (a trace's rows still need text cut to their
    ``input_len``). ``output_len`` None: ``default_max_tokens`` for every request, unless a row
    carries its own (a trace, a file's ``output_tokens``)."""
    rng = np.random.default_rng(seed)
    needs_cut = input_len is not None and input_len.kind != "dataset" or any(p.get("input_len") for p in prompts)
    needs_count = output_len is not None and output_len.kind == "dataset" and any(
        p.get("output_len") is None and p.get("reference_output") for p in prompts)
    cutter = cutter_factory() if (needs_cut or needs_count) and cutter_factory is not None else None
    if (needs_cut or needs_count) and cutter is None:
        raise UsageError("cutting prompts to token lengths needs the target's tokenizer (tokenizer.json): build the "
                         "deployment, or pass --tokenizer")
    summary: dict[str, Any] = {"input_len": input_len.describe() if input_len else None,
                               "output_len": output_len.describe() if output_len else None,
                               "cut_prompts": 0, "extended_prompts": 0, "inexact_cuts": 0}
    drawn_in = draw(input_len, len(prompts), rng) if input_len and input_len.kind != "dataset" else None
    drawn_out = draw(output_len, len(prompts), rng) if output_len and output_len.kind != "dataset" else None
    # a short prompt continues with its own category's text (the prompts after it in the dataset,
    # wrapping round), then with the rest of the text, so a category's prompts stay of its kind;
    # rows without text (a trace) take the text source from a different place each
    pools = category_texts or {}
    where = {cat: {t: k for k, t in enumerate(texts)} for cat, texts in pools.items()}
    members = {cat: set(texts) for cat, texts in pools.items()}
    corpus = cutter.corpus if cutter is not None else []
    for i, prompt in enumerate(prompts):
        target = drawn_in[i] if drawn_in is not None else prompt.get("input_len")
        if target:
            cat = prompt["category"] if prompt["prompt"].strip() else None
            pool, mine = pools.get(cat, []), members.get(cat, set())
            at = where.get(cat, {}).get(prompt["prompt"], -1) + 1
            own = itertools.chain(itertools.islice(pool, at, None), itertools.islice(pool, 0, max(0, at - 1)))
            start = i % len(corpus) if corpus else 0
            rest = (t for t in itertools.chain(itertools.islice(corpus, start, None), itertools.islice(corpus, 0, start))
                    if t not in mine)
            more = itertools.chain(own, rest)
            text, count, extended = cutter.cut(prompt["prompt"], int(target), more)
            prompt["prompt"], prompt["input_len"] = text, count
            prompt.pop("messages", None)  # the cut text goes as one user message
            summary["cut_prompts"] += 1
            summary["extended_prompts"] += int(extended)
            summary["inexact_cuts"] += int(count != int(target))
        if drawn_out is not None:
            prompt["max_tokens"] = drawn_out[i]
        elif output_len is not None and output_len.kind == "dataset" or prompt.get("output_len"):
            own = prompt.get("output_len")
            if own is None and prompt.get("reference_output"):
                own = max(1, cutter.count(prompt["reference_output"]))
            prompt["max_tokens"] = int(own) if own else int(default_max_tokens)
        prompt.pop("reference_output", None)
    lengths = [p.get("max_tokens", default_max_tokens) for p in prompts]
    summary["max_tokens"] = {"min": min(lengths), "max": max(lengths), "mean": round(float(np.mean(lengths)), 2)}
    inputs = [p["input_len"] for p in prompts if p.get("input_len")]
    if inputs:
        summary["input_tokens"] = {"min": min(inputs), "max": max(inputs), "mean": round(float(np.mean(inputs)), 2)}
    return summary
