"""Demo corpus, tokenizer and prompt sets: deterministic, every category present, files well formed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.demo import corpus
from pipeline.demo.prompt_sets import write_tiny_prompt_sets
from pipeline.demo.tokenizer import BOS_ID, EOS_ID, PAD_ID, save_tokenizer, train_tokenizer

ROOT = Path(__file__).resolve().parents[3]
TINY_PROMPTS = ROOT / "prompts" / "tiny"
REAL_CATEGORIES = ("code", "chat", "translation", "summarization", "math", "rag")


def test_same_seed_gives_identical_corpus_and_other_seed_differs():
    first = corpus.training_corpus(20, seed=5)
    assert first == corpus.training_corpus(20, seed=5)
    assert first != corpus.training_corpus(20, seed=6)


def test_training_corpus_holds_every_category_with_a_small_ood_share():
    counts = {}
    for cat, _ in corpus.training_corpus(20):
        counts[cat] = counts.get(cat, 0) + 1
    assert counts == {**{cat: 20 for cat in corpus.IN_DOMAIN}, "ood": 6}


def test_arithmetic_samples_are_correct_equations():
    for text in corpus.samples("arithmetic", 30, seed=1):
        for line in text.splitlines():
            left, right = line.split(" = ")
            a, op, b = left.split()
            assert {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op] == int(right)


def test_unknown_category_is_rejected():
    with pytest.raises(ValueError, match="unknown corpus category"):
        corpus.samples("poetry", 1, seed=0)


def test_tokenizer_round_trips_in_domain_and_ood_text(tmp_path):
    texts = [text for _, text in corpus.training_corpus(15)]
    tokenizer = train_tokenizer(texts, vocab_size=400)
    for text in texts[:10] + corpus.samples("ood", 5, seed=3) + ["naïve Ωmega ✓ \t tabs\n"]:
        ids = tokenizer.encode(text).ids
        assert ids[0] == BOS_ID
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert [tokenizer.token_to_id(t) for t in ("<pad>", "<s>", "</s>")] == [PAD_ID, BOS_ID, EOS_ID]
    save_tokenizer(tokenizer, tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert (config["bos_token"], config["eos_token"], config["pad_token"]) == ("<s>", "</s>", "<pad>")
    assert json.loads((tmp_path / "special_tokens_map.json").read_text())["eos_token"] == "</s>"


def test_tokenizer_training_is_deterministic(tmp_path):
    texts = [text for _, text in corpus.training_corpus(15)]
    save_tokenizer(train_tokenizer(texts, vocab_size=400), tmp_path / "a")
    save_tokenizer(train_tokenizer(texts, vocab_size=400), tmp_path / "b")
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_shipped_tiny_prompt_sets_are_regenerated_bit_for_bit(tmp_path):
    written = write_tiny_prompt_sets(tmp_path)
    assert {p.name for p in written} == {f"{c}.jsonl" for c in corpus.CATEGORIES}
    for path in written:
        assert (TINY_PROMPTS / path.name).read_bytes() == path.read_bytes(), path.name


@pytest.mark.parametrize("category", corpus.CATEGORIES)
def test_tiny_prompt_set_shape(category):
    records = _read_jsonl(TINY_PROMPTS / f"{category}.jsonl")
    assert len(records) >= 50
    assert len({r["id"] for r in records}) == len(records)
    for record in records:
        assert set(record) == {"id", "category", "prompt"}
        assert record["category"] == category and record["prompt"].strip()


def test_tiny_prompts_are_not_training_samples():
    training = {text for _, text in corpus.training_corpus(300)}
    for category in corpus.CATEGORIES:
        for record in _read_jsonl(TINY_PROMPTS / f"{category}.jsonl"):
            assert record["prompt"] not in training  # prefixes only, never whole samples


@pytest.mark.parametrize("category", REAL_CATEGORIES)
def test_real_model_prompt_sets(category):
    records = _read_jsonl(ROOT / "prompts" / f"{category}.jsonl")
    assert len(records) >= 20
    assert len({r["prompt"] for r in records}) == len(records)
    for record in records:
        assert set(record) == {"id", "category", "prompt"} and record["category"] == category
    if category == "rag":
        assert all(len(r["prompt"]) > 600 and "Question:" in r["prompt"] for r in records)
