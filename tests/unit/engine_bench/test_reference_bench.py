"""`specdeploy bench` end to end on tiny random checkpoints (structure and losslessness of the
report; speed is not asserted), and its user errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.cli import run
from pipeline.errors import SpecdeployError
from tests.reference_fixtures import one_thread, shared_checkpoints


def _config(tmp_path: Path, speculation: str) -> Path:
    path = tmp_path / "bench.yaml"
    path.write_text(
        "name: bench-test\nbackend: reference\nhardware: cpu\n"
        f"target: {{checkpoint: {shared_checkpoints()['target']}, dtype: float32}}\n"
        f"speculation: {speculation}\n"
        "build: {max_batch_size: 8, max_input_len: 64, max_seq_len: 128}\n"
        f"loadtest: {{prompts: {tmp_path / 'prompts'}}}\n"
    )
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    for cat in ("alpha", "beta"):
        (prompts / f"{cat}.jsonl").write_text("\n".join(
            json.dumps({"id": f"{cat}-{i}", "category": cat, "prompt": f"w{5 + i} w{9 + i} w{20 + i}"}) for i in range(3)))
    return path


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_bench_reports_every_category_batch_and_peer(tmp_path, capsys):
    one_thread()
    ckpt = shared_checkpoints()
    cfg = _config(tmp_path, f"{{method: draft_target, draft: {{checkpoint: {ckpt['draft']}}}, num_draft_tokens: 3}}")
    out = tmp_path / "report.json"
    assert run(["bench", str(cfg), "--json", "--prompts", "3", "--max-tokens", "6", "--peer", "hf",
                "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == report
    rows = {(r["method"], r["batch"], r["category"]) for r in report["results"]}
    assert rows == {("draft_target", b, c) for b in (1, 8) for c in ("alpha", "beta")}
    for r in report["results"]:
        assert r["outputs_match"] and r["tokens"] == r["baseline_tokens"] > 0
        assert 0 <= r["acceptance_rate"] <= 1 and r["mean_acceptance_length"] >= 1
        assert r["tokens_per_s"] > 0 and r["speedup"] > 0
        # decode-only view: TPOT from each request's first/last token times, tokens − 1 per request
        assert r["tpot_ms"] > 0 and r["baseline_tpot_ms"] > 0
        requests = 3 if r["batch"] == 1 else 16  # batch 8 keeps 2 x 8 requests coming
        assert (r["tokens"], r["decode_tokens"]) == (6 * requests, 5 * requests)
        assert r["decode_speedup"] == pytest.approx(r["baseline_tpot_ms"] / r["tpot_ms"], rel=2e-3)
    assert report["peer"]["num_assistant_tokens"] == 3 and report["peer"]["hf_assisted_tokens_per_s"] > 0
    scaling = report["baseline_scaling"]  # batch 8 vs 1, side by side, up to 4 prompts a category
    assert (scaling["batch"], scaling["prompts"], len(scaling["per_round"])) == (8, 6, scaling["rounds"])
    assert scaling["batch_tokens_per_s"] > 0 and scaling["batch1_tokens_per_s"] > 0
    assert scaling["ratio"] == pytest.approx(scaling["batch_tokens_per_s"] / scaling["batch1_tokens_per_s"], abs=2e-3)


def test_scaling_sample_leaves_out_of_domain_prompts_out():
    from pipeline.engine_bench import _in_domain_sample

    cats = {"code": [[1], [2], [3], [4], [5]], "ood": [[9]], "prose": [[6]]}
    assert _in_domain_sample(cats) == [[1], [2], [3], [4], [6]]
    assert _in_domain_sample({"ood": [[9], [8]]}) == [[9], [8]]  # nothing in-domain: use what there is


def test_bench_medusa_table_and_errors(tmp_path, capsys):
    one_thread()
    ckpt = shared_checkpoints()
    cfg = _config(tmp_path, f"{{method: medusa, heads_dir: {ckpt['medusa']}, num_heads: 3}}")
    assert run(["bench", str(cfg), "--prompts", "2", "--max-tokens", "4", "--batch", "1"]) == 0
    table = capsys.readouterr().out
    assert "medusa" in table and "alpha" in table and "speedup" in table
    assert "baseline batch" not in table  # batch 1 only: nothing to scale against
    with pytest.raises(SpecdeployError, match="only 'hf'"):
        run(["bench", str(cfg), "--peer", "vllm"])
    none_cfg = _config(tmp_path / "n", "{method: none}") if (tmp_path / "n").mkdir() is None else None
    with pytest.raises(SpecdeployError, match="nothing to compare"):
        run(["bench", str(none_cfg), "--prompts", "1"])


@pytest.mark.parametrize("config_weights,extra", [("float", "medusa+draft_int8"), ("int8", "medusa+draft_float")])
def test_bench_draft_int8_measures_the_other_draft_weights(tmp_path, capsys, config_weights, extra):
    one_thread()
    cfg = _config(tmp_path, f"{{method: medusa, heads_dir: {shared_checkpoints()['medusa']}, num_heads: 3}}")
    cfg.write_text(cfg.read_text() + f"reference: {{draft_weights: {config_weights}}}\n")
    out = tmp_path / "report.json"
    assert run(["bench", str(cfg), "--json", "--prompts", "1", "--max-tokens", "4", "--batch", "1",
                "--draft-int8", "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["draft_weights"] == config_weights
    assert {r["method"] for r in report["results"]} == {"medusa", extra}
    assert all(r["outputs_match"] for r in report["results"])


def _result(category: str, tokens_per_s: float, baseline: float, batch: int = 1) -> dict:
    return {"method": "medusa", "batch": batch, "category": category, "tokens": 100, "baseline_tokens": 100,
            "tokens_per_s": tokens_per_s, "baseline_tokens_per_s": baseline,
            "cpu_tokens_per_s": tokens_per_s, "baseline_cpu_tokens_per_s": baseline,
            "acceptance_rate": 0.5, "mean_acceptance_length": 2.0, "outputs_match": True,
            "decode_tokens": 90, "baseline_decode_tokens": 90, "tpot_ms": 1000 / tokens_per_s,
            "baseline_tpot_ms": 1000 / baseline}


def test_summary_pools_all_categories_and_in_domain_ones_separately():
    from pipeline.engine_bench import summarize

    rows = [_result("code", 400, 100), _result("prose", 200, 100), _result("ood", 100, 100)]
    by_scope = {s["scope"]: s for s in summarize(rows)}
    # pooled = total tokens / total seconds: 300 / (0.25 + 0.5 + 1.0) vs 300 / 3.0
    assert by_scope["all"]["speedup"] == pytest.approx((300 / 1.75) / 100, abs=1e-3)
    assert by_scope["in_domain"]["speedup"] == pytest.approx((200 / 0.75) / 100, abs=1e-3)
    assert by_scope["in_domain"]["categories"] == ["code", "prose"]
    # TPOT pooled the same way (decode time / decode tokens): 2.5 and 5 ms at 90 tokens each
    assert by_scope["in_domain"]["tpot_ms"] == pytest.approx(3.75) and by_scope["in_domain"]["baseline_tpot_ms"] == 10
    assert by_scope["in_domain"]["decode_speedup"] == pytest.approx(10 / 3.75, abs=1e-3)
    # no out-of-domain category in the prompt set: one scope only
    assert [s["scope"] for s in summarize(rows[:2])] == ["all"]
