"""Reach: headers, an API key from the environment and extra body fields, on the wire and never in a
file. The fake server (locustfiles/fake_server.py) logs every request it gets (``--request-log``, a
file outside the run directory) and, with ``--api-key``, answers 401 without the bearer token, as an
auth gateway or vLLM's ``--api-key`` does. An A/B against two key-protected OpenAI endpoints runs
with the key and stops with a clear usage error (exit 2) without it; the key is in no file of the run
directory: settings, run.json, runs.json, raw records, Locust logs, report.*."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lt_common import MissingApiKey, RunSettings, request_headers
from pipeline.config import LoadTestSettings, parse_config
from pipeline.errors import EXIT_USAGE
from pipeline.loadtest import reach, runner
from pipeline.loadtest.cells import plan_runs
from pipeline.loadtest.endpoints import ArmEndpoint
from tests.unit.cli_inproc import specdeploy
from tests.unit.fake_servers import Fake

ROOT = Path(__file__).resolve().parents[3]
PROMPTS = ROOT / "tests" / "fixtures" / "prompts_small.jsonl"
KEY = "sk-test-Zq81-never-in-a-file"
HEADER_SECRET = "hdr-7Tq-also-never-in-a-file"


def test_the_key_is_read_from_the_named_variable_and_sent_as_a_bearer_token():
    settings = RunSettings(run_id="t", arm="baseline", repeat=0, endpoint="x", model_name="m",
                           headers={"X-Tenant": "blue"}, api_key_env="MY_KEY")
    assert request_headers(settings, {"MY_KEY": KEY}) == {"X-Tenant": "blue", "Authorization": f"Bearer {KEY}"}
    with pytest.raises(MissingApiKey, match="MY_KEY is not set"):
        request_headers(settings, {})
    assert request_headers(RunSettings(run_id="t", arm="a", repeat=0, endpoint="x", model_name="m"), {}) == {}


def test_which_variable_the_key_comes_from():
    openai = LoadTestSettings(transport="openai")
    assert reach.api_key_env(openai, {"OPENAI_API_KEY": KEY}) == "OPENAI_API_KEY"  # as OpenAI clients and vLLM
    assert reach.api_key_env(openai, {}) is None  # no key set: none sent
    assert reach.api_key_env(LoadTestSettings(transport="http"), {"OPENAI_API_KEY": KEY}) is None
    named = LoadTestSettings(transport="http", api_key_env="GATEWAY_TOKEN")
    assert reach.request_headers(named, {"GATEWAY_TOKEN": KEY}) == {"Authorization": f"Bearer {KEY}"}
    with pytest.raises(reach.ApiKeyError, match="GATEWAY_TOKEN is not set") as err:
        reach.api_key_env(named, {})
    assert err.value.exit_code == EXIT_USAGE


def make_cfg(transport: str, **loadtest):
    return parse_config({
        "name": "reach", "backend": "reference",
        "target": {"checkpoint": "builtin:tiny-target", "dtype": "float32"},
        "speculation": {"method": "draft_target", "num_draft_tokens": 3, "orchestration": "bls",
                        "draft": {"checkpoint": "builtin:tiny-draft", "dtype": "float32"}},
        "loadtest": {"transport": transport, "concurrency": [1], "duration_s": 2, "warmup_s": 0.2, "repeats": 1,
                     "max_tokens": 4, "prompts": str(PROMPTS), "stop_timeout_s": 5, **loadtest},
    })


def test_the_settings_file_names_the_variable_never_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("GATEWAY_TOKEN", KEY)
    cfg = make_cfg("http", api_key_env="GATEWAY_TOKEN", headers={"X-Tenant": "blue"}, extra_body={"ignore_eos": True})
    spec = plan_runs(cfg, ("baseline",), [1], 1, [])[0]
    settings = runner.run_settings(cfg, spec, ArmEndpoint("baseline", "http://h:1", "m", {}), tmp_path, "t",
                                   [{"id": "a", "prompt": "x"}], 2.0, 0.2, None)
    assert settings["api_key_env"] == "GATEWAY_TOKEN" and list(settings["headers"]) == ["X-Tenant"]
    assert settings["extra_body"] == {"ignore_eos": True}
    assert KEY not in json.dumps(settings) and "blue" not in json.dumps(settings)  # values: vLLM calls them sensitive


def wire(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []


def measure(tmp: Path, cfg, url: str, model: str) -> dict:
    for sub in ("raw/parts", "settings", "logs", "metrics"):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
    from pipeline.loadtest.inputs import load_prompt_set

    spec = plan_runs(cfg, ("baseline",), [1], 1, [])[0]
    # a 1 s window: the claim is what every request carries, and ≈ 15 ms requests give dozens of them
    return runner.execute_run(cfg, spec, ArmEndpoint("baseline", url, model, {}), tmp, "t", load_prompt_set(cfg)[0],
                              1.0, 0.2, None)


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["openai", "http"])
def test_headers_key_and_extra_body_go_over_the_wire(tmp_path, monkeypatch, transport):
    log = tmp_path / "wire.jsonl"
    server = Fake("--ttft-ms", "5", "--tpot-ms", "2", "--max-tokens-cap", "4", "--api-key", KEY,
                  "--request-log", str(log))
    monkeypatch.setenv("GATEWAY_TOKEN", KEY)
    cfg = make_cfg(transport, headers={"X-Tenant": "blue", "X-Route": "a:b"}, api_key_env="GATEWAY_TOKEN",
                   extra_body={"ignore_eos": True, "min_tokens": 4, "chat_template_kwargs": {"x": 1}})
    try:
        result = measure(tmp_path / "run", cfg, server.url, "fake" if transport == "openai" else "tensorrt_llm_bls")
    finally:
        server.close()
    assert result["valid"], result["invalid_reasons"]
    posts = [r for r in wire(log) if r["method"] == "POST"]
    assert posts and len(posts) == result["sent"]
    for request in posts:
        assert request["headers"]["authorization"] == f"Bearer {KEY}"
        assert request["headers"]["x-tenant"] == "blue" and request["headers"]["x-route"] == "a:b"
        assert request["body"]["ignore_eos"] is True and request["body"]["min_tokens"] == 4
        assert request["body"]["chat_template_kwargs"] == {"x": 1}
    assert not any(KEY in path.read_text(errors="replace") for path in (tmp_path / "run").rglob("*") if path.is_file())


def write_lt_file(tmp: Path) -> Path:
    data = {"name": "keyed", "hardware": "this test machine",
            "loadtest": {"prompts": str(PROMPTS), "concurrency": [1], "duration_s": 1, "warmup_s": 0.2, "repeats": 1,
                         "max_tokens": 4, "stop_timeout_s": 5}}
    path = tmp / "lt.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.slow
def test_an_ab_against_key_protected_endpoints(tmp_path, monkeypatch):
    from pipeline.loadtest.endpoints_only import run_endpoint_loadtest
    from pipeline.report.builder import make_report

    base = Fake("--ttft-ms", "10", "--tpot-ms", "4", "--max-tokens-cap", "4", "--api-key", KEY)
    spec = Fake("--ttft-ms", "10", "--tpot-ms", "2", "--tokens-per-chunk", "2", "--max-tokens-cap", "4",
                "--api-key", KEY)
    lt_file = write_lt_file(tmp_path)
    try:
        # without the key: a usage error naming what to do, before any load (exit 2)
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        denied = specdeploy("loadtest", "--loadtest-file", lt_file, "--endpoint-baseline", base.url,
                            "--endpoint-speculative", spec.url, "--model", "fake", "--out", tmp_path / "denied",
                            "--no-progress")
        assert denied.returncode == EXIT_USAGE, denied.stderr
        assert "HTTP 401" in denied.stderr and "--api-key-env" in denied.stderr and "no API key was sent" in denied.stderr
        # with the key in OPENAI_API_KEY (the OpenAI default), and again under a name of our choosing
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        run_dir, cfg = run_endpoint_loadtest(lt_file, endpoint_baseline=base.url, endpoint_speculative=spec.url,
                                             model="fake", out_dir=tmp_path / "run", progress=False, report=False,
                                             overrides={"goodput": "ttft:1000 e2el:5000",
                                                        "headers": [f"X-Gateway-Token: {HEADER_SECRET}"]})
        report = make_report(run_dir, cfg)
    finally:
        base.close()
        spec.close()
    runs = json.loads((run_dir / "runs.json").read_text())["runs"]
    assert [r["key"] for r in runs] == ["baseline-c1-r0", "speculative-c1-r0"]
    assert all(r["valid"] and r["n_records"] > 0 for r in runs)
    records = [json.loads(line) for r in runs for line in (run_dir / r["raw"]).read_text().splitlines()]
    assert records and all(r["status"] == "ok" for r in records)
    assert report.data["gate_settings"]["slo"]["declared"] and report.verdict in ("NO-GO", "INCONCLUSIVE")
    files = [path for path in run_dir.rglob("*") if path.is_file()]
    assert any(p.name == "report.html" for p in files) and any(p.suffix == ".log" for p in files)
    leaked = [str(p) for p in files if KEY in p.read_text(errors="replace") or HEADER_SECRET in p.read_text(errors="replace")]
    assert not leaked, f"the API key was written to {leaked}"
    settings = json.loads(next((run_dir / "settings").glob("*.json")).read_text())
    assert settings["api_key_env"] == "OPENAI_API_KEY"
