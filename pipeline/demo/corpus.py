"""Deterministic text generators for the demo models' corpus and prompt sets.

Reads nothing; returns text. Each in-domain category (``code``, ``records``, ``prose``,
``arithmetic``) has a generator that turns a seeded ``random.Random`` into one *sample* (a short
document). The same seed always yields the same samples, so the training corpus, the held-out
evaluation text and the shipped prompt sets (``prompts/tiny``) are reproducible. The
``ood`` category (made-up syllables, symbols, shuffled words) is the low-predictability one
where speculation is expected not to pay: a small share of it is in the training stream so
the target continues such prompts *in kind* (each next token nearly uniformly likely, so no
draft can guess the target's choice) instead of snapping back to a predictable in-domain mode. All text is generated
here from small word lists written for this project — no third-party text.
"""

from __future__ import annotations

import random
from typing import Callable

IN_DOMAIN = ("code", "records", "prose", "arithmetic")
CATEGORIES = IN_DOMAIN + ("ood",)

MAX_PROMPT_CHARS = 160  # ≈ 60 tokens: prompt + 48 new tokens stay within the trained window
OOD_SHARE = 0.3  # ood samples in training, relative to one in-domain category

# Seeds: training text and held-out text come from disjoint streams.
TRAIN_SEED = 20260101
HELDOUT_SEED = 7_000_003

_VERBS = ["scale", "filter", "merge", "count", "parse", "load", "sort", "clean", "split", "check"]
_NOUNS = ["items", "values", "names", "rows", "scores", "events", "tokens", "users", "orders", "paths"]
_ARGS = ["data", "limit", "factor", "prefix", "offset", "key", "size", "step"]
_OPS = ["+", "-", "*"]

_FIRST = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory", "oscar"]
_CITIES = ["paris", "lagos", "lima", "oslo", "tokyo", "quito", "cairo", "perth", "dublin", "hanoi"]
_ROLES = ["admin", "editor", "viewer", "owner"]

_ADJ = ["quiet", "small", "bright", "old", "green", "busy", "calm", "tall"]
_ANIMALS = ["fox", "cat", "dog", "owl", "bear", "horse", "rabbit", "crow"]
_PLACES = ["garden", "forest", "village", "river", "market", "field", "harbor", "valley"]
_MOVES = ["walks to", "runs past", "sleeps near", "looks at", "waits by", "jumps over"]
_TIMES = ["in the morning", "at noon", "in the evening", "at night", "after the rain"]
_FEELINGS = ["happy", "tired", "curious", "hungry", "calm"]

# Out-of-domain material: made-up syllables and symbols, never seen in training.
_SYLLABLES = ["zor", "qua", "vex", "plim", "drak", "yune", "okt", "frel", "bazi", "wum", "trov", "gix"]
_SYMBOLS = list("#@%&^~|<>[]{}") + ["Ω", "λ", "ß", "ø", "ç", "é"]


def _code(rng: random.Random) -> str:
    """Two or three small functions, each followed by a call (long enough that a prompt's
    continuation stays inside the document)."""
    return "\n".join(_function(rng) for _ in range(rng.randrange(2, 4)))


def _function(rng: random.Random) -> str:
    verb, noun = rng.choice(_VERBS), rng.choice(_NOUNS)
    arg = rng.choice(_ARGS)
    op = rng.choice(_OPS)
    item = noun[:-1]
    shape = rng.randrange(3)
    lines = [f"def {verb}_{noun}({noun}, {arg}):"]
    if shape == 0:
        lines += [
            "    result = []",
            f"    for {item} in {noun}:",
            f"        result.append({item} {op} {arg})",
            "    return result",
        ]
    elif shape == 1:
        lines += [
            "    total = 0",
            f"    for {item} in {noun}:",
            f"        if {item} > {arg}:",
            f"            total = total {op} {item}",
            "    return total",
        ]
    else:
        lines += [
            "    out = {}",
            f"    for i, {item} in enumerate({noun}):",
            f"        out[i] = {item} {op} {arg}",
            "    return out",
        ]
    call = f"print({verb}_{noun}([{', '.join(str(rng.randrange(10)) for _ in range(3))}], {rng.randrange(1, 10)}))"
    return "\n".join(lines + ["", call]) + "\n"


def _records(rng: random.Random) -> str:
    start = rng.randrange(1, 60)
    rows = []
    if rng.random() < 0.5:
        for i in range(rng.randrange(6, 10)):
            rows.append(
                '{"id": %d, "name": "%s", "city": "%s", "age": %d, "active": %s}'  # noqa: UP031 - the exact format the shipped corpus was generated with
                % (
                    start + i,
                    rng.choice(_FIRST),
                    rng.choice(_CITIES),
                    rng.randrange(18, 80),
                    rng.choice(["true", "false"]),
                )
            )
        return "\n".join(rows) + "\n"
    rows.append("id,name,role,score")
    for i in range(rng.randrange(20, 30)):
        rows.append(f"{start + i},{rng.choice(_FIRST)},{rng.choice(_ROLES)},{rng.randrange(0, 100)}")
    return "\n".join(rows) + "\n"


def _prose(rng: random.Random) -> str:
    animal, place = rng.choice(_ANIMALS), rng.choice(_PLACES)
    sentences = [f"The {rng.choice(_ADJ)} {animal} {rng.choice(_MOVES)} the {place} {rng.choice(_TIMES)}."]
    for _ in range(rng.randrange(7, 11)):
        kind = rng.randrange(3)
        if kind == 0:
            sentences.append(f"The {animal} is {rng.choice(_FEELINGS)} and {rng.choice(_MOVES)} the {rng.choice(_PLACES)}.")
        elif kind == 1:
            sentences.append(f"Then the {animal} {rng.choice(_MOVES)} the {rng.choice(_ADJ)} {rng.choice(_ANIMALS)}.")
        else:
            sentences.append(f"It is {rng.choice(_TIMES).split(' ', 1)[1]} and the {place} is {rng.choice(_ADJ)}.")
    return " ".join(sentences) + "\n"


def _arithmetic(rng: random.Random) -> str:
    """Small tables: the first operand counts up, the operator and second operand stay
    (``12 + 7 = 19``, ``13 + 7 = 20``, …), so a continuation has one right next line."""
    lines = []
    while len(lines) < rng.randrange(30, 40):
        op, b = rng.choice(_OPS), rng.randrange(1, 10)
        a = rng.randrange(b if op == "-" else 0, 15)
        for i in range(rng.randrange(5, 9)):
            value = {"+": a + i + b, "-": a + i - b, "*": (a + i) * b}[op]
            lines.append(f"{a + i} {op} {b} = {value}")
    return "\n".join(lines) + "\n"


def _ood_word(rng: random.Random) -> str:
    kind = rng.randrange(3)
    if kind == 0:
        return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randrange(1, 4)))
    if kind == 1:
        return "".join(rng.choice(_SYMBOLS) for _ in range(rng.randrange(1, 4)))
    chars = list(rng.choice(_NOUNS + _PLACES + _CITIES))
    rng.shuffle(chars)
    return "".join(chars).upper() if rng.random() < 0.3 else "".join(chars)


def _ood(rng: random.Random) -> str:
    """One long line of made-up words (no newline until the end), so a continuation of a
    prompt cut mid-line stays in kind for many tokens."""
    return " ".join(_ood_word(rng) for _ in range(rng.randrange(60, 90))) + "\n"


GENERATORS: dict[str, Callable[[random.Random], str]] = {
    "code": _code,
    "records": _records,
    "prose": _prose,
    "arithmetic": _arithmetic,
    "ood": _ood,
}


def samples(category: str, count: int, seed: int) -> list[str]:
    """``count`` samples of one category; the same (category, count, seed) → the same list."""
    if category not in GENERATORS:
        raise ValueError(f"unknown corpus category {category!r}; known: {', '.join(CATEGORIES)}")
    rng = random.Random(f"{category}:{seed}")
    return [GENERATORS[category](rng) for _ in range(count)]


def training_corpus(samples_per_category: int, seed: int = TRAIN_SEED) -> list[tuple[str, str]]:
    """Interleaved ``(category, text)`` training samples: every in-domain category plus a
    smaller share (``OOD_SHARE``) of unpredictable ``ood`` text."""
    per_category = {cat: samples(cat, samples_per_category, seed) for cat in IN_DOMAIN}
    per_category["ood"] = samples("ood", max(1, int(samples_per_category * OOD_SHARE)), seed)
    mixed = [(cat, text) for cat in CATEGORIES for text in per_category[cat]]
    random.Random(seed).shuffle(mixed)
    return mixed


def prompt_prefix(category: str, text: str, rng: random.Random) -> str:
    """Cut a held-out sample into a prompt: whole leading sentences (prose) or lines, at most
    ``MAX_PROMPT_CHARS``, never ending in whitespace (byte-level BPE merges a newline with the
    next line's indentation, so a prompt ending in a bare newline would be a token sequence the
    model never saw). The model should produce the rest of the document."""
    if category == "prose":
        parts = text.split(". ")
        keep = rng.randrange(1, 4)
        while keep > 1 and len(". ".join(parts[:keep])) > MAX_PROMPT_CHARS:
            keep -= 1
        return ". ".join(parts[:keep]).rstrip(".\n") + "."
    if category == "ood":  # one long line: cut after some words
        prompt = " ".join(text.split()[: rng.randrange(12, 24)])
        return prompt if len(prompt) <= MAX_PROMPT_CHARS else prompt[:MAX_PROMPT_CHARS].rsplit(" ", 1)[0]
    lines = text.splitlines()
    keep = max(1, rng.randrange(min(2, len(lines) - 1), max(3, len(lines) - 1)))
    while keep > 1 and len("\n".join(lines[:keep])) > MAX_PROMPT_CHARS:
        keep -= 1
    return "\n".join(lines[:keep]).rstrip()


def prompts(category: str, count: int, seed: int = HELDOUT_SEED) -> list[dict[str, str]]:
    """``count`` prompt records ``{"id", "category", "prompt"}`` from held-out samples."""
    rng = random.Random(f"prompts:{category}:{seed}")
    return [
        {"id": f"{category}-{i:03d}", "category": category, "prompt": prompt_prefix(category, text, rng)}
        for i, text in enumerate(samples(category, count, seed))
    ]
