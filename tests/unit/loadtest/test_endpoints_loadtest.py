"""`loadtest --loadtest-file` against two OpenAI-compatible endpoints (the fake server's OpenAI
mode, two processes with different known timing): no deployment config, a report with a verdict,
and `specdeploy report` on the run directory as for a served deployment; bad files name the field."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "locustfiles"))

from test_loadtest_fake_server import FakeServer  # noqa: E402 - after the sys.path set-up above

from tests.unit.cli_inproc import specdeploy  # noqa: E402 - after the sys.path set-up above

TOKENIZER = ROOT / "pipeline" / "demo" / "artifacts" / "tiny-target"


def write_lt_file(tmp: Path, metrics: str | None = None, **loadtest) -> Path:
    (tmp / "prompts").mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"{cat}-{i}", "prompt": f"{cat} prompt {i}"} for cat in ("code", "chat") for i in range(4)]
    for cat in ("code", "chat"):
        (tmp / "prompts" / f"{cat}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows if r["id"].startswith(cat)))
    data = {"name": "fake-ab", "description": "two fake servers", "hardware": "this test machine",
            "loadtest": {"prompts": "prompts", "concurrency": [1, 4], "duration_s": 3, "warmup_s": 0.5,
                         "repeats": 1, "max_tokens": 16, **loadtest}}
    if metrics:
        data["metrics_speculative"] = metrics
    path = tmp / "lt.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_bad_loadtest_file_names_the_field(tmp_path):
    from pipeline.errors import ConfigError
    from pipeline.loadtest.endpoints_only import load_loadtest_file

    path = write_lt_file(tmp_path, concurency=[1])
    with pytest.raises(ConfigError) as err:
        load_loadtest_file(path)
    assert "loadtest.concurency" in str(err.value)
    path.write_text(yaml.safe_dump({"name": "x", "loadtest": {"transport": "smtp"}}))
    with pytest.raises(ConfigError, match="loadtest.transport"):
        load_loadtest_file(path)


def test_defaults_to_the_openai_transport(tmp_path):
    from pipeline.loadtest.endpoints_only import deployment_config, load_loadtest_file

    lt = load_loadtest_file(write_lt_file(tmp_path))
    assert lt.loadtest.transport == "openai"
    cfg = deployment_config(lt, "my-model", "openai", tmp_path / "lt.yaml")
    assert cfg.method == "none" and cfg.target.checkpoint == "my-model" and cfg.loadtest.concurrency == [1, 4]


@pytest.mark.e2e
@pytest.mark.slow
def test_ab_between_two_openai_endpoints_gives_a_verdict(tmp_path):
    from pipeline.loadtest.endpoints_only import run_endpoint_loadtest

    base = FakeServer("--ttft-ms", "40", "--tpot-ms", "20", "--max-tokens-cap", "16")
    spec = FakeServer("--ttft-ms", "40", "--tpot-ms", "8", "--tokens-per-chunk", "3", "--max-tokens-cap", "16")
    try:
        run_dir, cfg = run_endpoint_loadtest(
            write_lt_file(tmp_path, metrics=f"http://127.0.0.1:{spec.port}/metrics"),
            endpoint_baseline=f"127.0.0.1:{base.port}",
            endpoint_speculative=f"http://127.0.0.1:{spec.port}/v1", model="fake", tokenizer=str(TOKENIZER),
            out_dir=tmp_path / "run", progress=False)
    finally:
        base.close()
        spec.close()
    runs = json.loads((run_dir / "runs.json").read_text())["runs"]
    assert [r["key"] for r in runs] == ["baseline-c1-r0", "speculative-c1-r0", "baseline-c4-r0", "speculative-c4-r0"]
    for run in runs:
        assert run["valid"], run["invalid_reasons"]
        records = [json.loads(line) for line in (run_dir / run["raw"]).read_text().splitlines()]
        assert len(records) == run["sent"] > 0
        ok = [r for r in records if r["status"] == "ok"]
        assert ok and all(r["transport"] == "openai" and r["osl"] == 16 and r["osl_source"] == "server" for r in ok)
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["hardware"]["declared"] == "this test machine" and meta["tokenizer_dir"] == str(TOKENIZER)
    report = json.loads((run_dir / "report.json").read_text())
    assert report["verdict"] in ("NO-GO", "INCONCLUSIVE")  # one repeat: never enough evidence for GO
    assert len(report["comparisons"]) == 2
    # the speculative server's vLLM-style counters: 3-token chunks, one draft of 3 per chunk after the first
    spec_runs = [r for r in runs if r["arm"] == "speculative"]
    assert all(r["metrics_delta"]["source"] == "vllm" and r["metrics_delta"]["draft_tokens"] > 0 for r in spec_runs)
    # no metrics_baseline in the file: the baseline's own /metrics is read (the fake's 1-token chunks: none accepted)
    assert all(r["metrics_delta"]["source"] == "vllm" and r["metrics_delta"]["accepted_tokens"] == 0
               for r in runs if r["arm"] == "baseline")
    assert meta["server_metrics"]["baseline"] == {"url": f"http://127.0.0.1:{base.port}/metrics",
                                                  "from": "the endpoint's own /metrics"}
    assert meta["server_metrics"]["speculative"]["from"] == "load-test file"
    d = spec_runs[0]["metrics_delta"]
    assert d["accepted_tokens"] / d["draft_tokens"] == pytest.approx(2 / 3, abs=0.05)
    # the same figures as the report reads them: the server named, a counter delta, rate and τ
    assert all(r["server_acceptance"]["source"] == "vllm" and r["server_acceptance"]["kind"] == "counter delta"
               for r in spec_runs)
    assert all(r["server_acceptance"]["acceptance_rate"] == 0 for r in runs if r["arm"] == "baseline")
    assert spec_runs[0]["server_acceptance"]["acceptance_rate"] == pytest.approx(2 / 3, abs=0.05)
    assert report["acceptance_source"] == "vllm"  # the OpenAI records carry no per-request acceptance
    assert report["acceptance_rate"] == pytest.approx(2 / 3, abs=0.05)
    assert [r["source"] for r in report["acceptance_by_source"]] == ["vllm"]
    # `specdeploy report` re-reads the run directory alone (the config snapshot in run.json)
    proc = specdeploy("report", str(run_dir), "--json")
    assert proc.returncode in (1, 3), proc.stderr[-2000:]
    assert json.loads((run_dir / "report.json").read_text())["verdict"] == report["verdict"]


@pytest.mark.parametrize(("argv", "message"), [
    ([], "a deployment config (CONFIG) or --loadtest-file is needed"),
    (["--loadtest-file", "/nonexistent/lt.yaml", "--endpoint-baseline", "x", "--arm", "baseline", "--model", "m"],
     "no such load-test file"),
    (["--loadtest-file", "lt.yaml", "--model", "m"], "pass --endpoint-baseline and --endpoint-speculative"),
])
def test_cli_refuses_incomplete_endpoint_runs(argv, message):
    proc = specdeploy("loadtest", *argv)
    assert proc.returncode != 0 and message in proc.stdout + proc.stderr


def test_vllm_spec_decode_counters_are_read():
    from pipeline.loadtest.server_metrics import parse_counters

    text = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 25.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 5.0
"""
    assert parse_counters(text) == {"draft_tokens": 40.0, "accepted_tokens": 30.0, "verify_steps": 10.0}
