"""A load test against an OpenAI-compatible server this project did not write: Hugging Face
``transformers serve`` (installed from the package registry by scripts/third_party_openai.sh into
.venv-tfserve), on CPU, with the project's demo target.

Two servers: the baseline, and the same checkpoint whose generation config turns on prompt-lookup
decoding (``prompt_lookup_num_tokens``: transformers' n-gram speculation, greedy and lossless).
``transformers serve`` names a pinned model by the path it was given, so the arms have different
model names (``--model-baseline`` / ``--model-speculative``, checked against ``GET /v1/models``);
it refuses any field it does not know (HTTP 422), so greedy goes as temperature 0 and no ``top_k``.
The real ``specdeploy loadtest`` CLI runs the A/B; every request must succeed, output lengths come
from the server's ``usage``, both arms' greedy outputs are equal, and the report gives a verdict —
NO-GO here, because this server's ``usage`` undercounts under prompt lookup (one count per
``generate`` step) and the re-tokenized cross-check and the output-length check say so.
Quirks: docs/openai-endpoints.md.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("SPECDEPLOY_TFSERVE_VENV", ROOT / ".venv-tfserve"))
SERVE = VENV / "bin" / "transformers"
TARGET = ROOT / "pipeline" / "demo" / "artifacts" / "tiny-target"
START_TIMEOUT_S = 300  # model load on a loaded 2-core machine; a readiness poll, not a sleep

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _checkpoint(tmp: Path, name: str, **generation) -> Path:
    """A copy of the demo target; ``generation`` goes into its generation_config.json."""
    path = tmp / name
    shutil.copytree(TARGET, path)
    config = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**config, **generation}, indent=1))
    return path


def _start(model: Path, port: int, log: Path):
    from pipeline.infra.processes import spawn

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with open(log, "w") as fh:
        proc = spawn([str(SERVE), "serve", str(model), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
                     env=env, stdout=fh, stderr=subprocess.STDOUT, grace_s=5)
    return proc


def _wait_ready(port: int, proc, log: Path) -> list[str]:
    def models() -> list[str] | None:
        if proc.poll() is not None:
            pytest.fail(f"transformers serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as resp:
                return [m["id"] for m in json.loads(resp.read())["data"]]
        except OSError:
            return None  # not listening yet

    return wait_until(models, "transformers serve ready", START_TIMEOUT_S, interval=0.5,
                      detail=lambda: log.read_text()[-3000:])


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    if not SERVE.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{SERVE} missing: .ci/run installs it with scripts/third_party_openai.sh")
        pytest.skip("run scripts/third_party_openai.sh to install transformers serve")
    tmp = tmp_path_factory.mktemp("tfserve")
    arms = {"baseline": _checkpoint(tmp, "tiny-target"),
            "speculative": _checkpoint(tmp, "tiny-target-prompt-lookup", prompt_lookup_num_tokens=4,
                                       max_matching_ngram_size=2)}
    started, procs = time.monotonic(), {}
    try:
        for arm, model in arms.items():
            port = _free_port()
            procs[arm] = (_start(model, port, tmp / f"{arm}.log"), port, model)
        listed = {arm: _wait_ready(port, proc, tmp / f"{arm}.log") for arm, (proc, port, _) in procs.items()}
        print(f"transformers serve: both arms ready in {time.monotonic() - started:.0f}s")
        yield {arm: {"url": f"http://127.0.0.1:{port}", "model": str(model), "listed": listed[arm],
                     "log": tmp / f"{arm}.log"} for arm, (_, port, model) in procs.items()}
    finally:
        for proc, _, _ in procs.values():
            proc.stop(5)


def _lt_file(tmp: Path) -> Path:
    (tmp / "prompts").mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"rep-{i}", "category": "repeat", "prompt": f"the cat sat on the mat. the cat sat on the mat {i}."}
            for i in range(4)] + [{"id": f"chat-{i}", "category": "chat", "prompt": f"hello, how are you {i}?"}
                                  for i in range(4)]
    (tmp / "prompts" / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = {"name": "tfserve-prompt-lookup", "description": "transformers serve, prompt lookup vs none",
            "hardware": "CI, 2 CPU cores",
            "loadtest": {"prompts": str(tmp / "prompts"), "concurrency": [1], "duration_s": 12, "warmup_s": 2, "repeats": 1,
                         "max_tokens": 24, "sampling": {"temperature": 0, "top_k": 1, "seed": 0}}}
    (tmp / "lt.yaml").write_text(yaml.safe_dump(data))
    return tmp / "lt.yaml"


# with the A/B below: the two servers take about 30 s to start on two cores, and in the full tier
# they started for this check alone, then again for the A/B in the end-to-end tier; CI runs both
@pytest.mark.e2e
def test_names_by_path_and_refuses_unknown_fields(servers):
    base = servers["baseline"]
    assert base["listed"] == [base["model"]]  # a pinned server lists the path it was given
    body = json.dumps({"model": base["model"], "prompt": "hi", "max_tokens": 2, "top_k": 1}).encode()
    request = urllib.request.Request(base["url"] + "/v1/completions", data=body,  # noqa: S310 - loopback URL
                                     headers={"Content-Type": "application/json"}, method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)  # noqa: S310 - loopback URL
    assert refused.value.code == 422 and "Unexpected fields" in refused.value.read().decode()


@pytest.mark.e2e  # a whole A/B load-test run: the end-to-end tier (docs/testing.md)
def test_loadtest_baseline_vs_prompt_lookup(servers, tmp_path):
    out = tmp_path / "run"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "loadtest", "--loadtest-file", str(_lt_file(tmp_path)),
         "--endpoint-baseline", servers["baseline"]["url"], "--endpoint-speculative", servers["speculative"]["url"],
         "--model-baseline", servers["baseline"]["model"], "--model-speculative", servers["speculative"]["model"],
         "--tokenizer", str(TARGET), "--out", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=900, cwd=str(ROOT))
    print(f"specdeploy loadtest against transformers serve: {time.monotonic() - started:.0f}s")
    logs = {arm: s["log"].read_text()[-2000:] for arm, s in servers.items()}
    # NO-GO (exit 1): the undercounted usage fails the output-length check below
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:] + str(logs)
    runs = json.loads((out / "runs.json").read_text())["runs"]
    assert {r["arm"] for r in runs} == {"baseline", "speculative"}
    outputs: dict[str, dict[str, str]] = {}
    for run in runs:
        assert run["valid"], run["invalid_reasons"]
        records = [json.loads(line) for line in (out / run["raw"]).read_text().splitlines()]
        assert records and all(r["status"] == "ok" for r in records), [r["error"] for r in records][:3]
        assert all(r["osl_source"] == "server" and 0 < r["osl"] <= 24 for r in records)  # from usage
        assert all(r["osl_retok"] is not None for r in records)
        for r in records:
            outputs.setdefault(run["arm"], {})[r["prompt_id"]] = r["output_text"]
    shared = set(outputs["baseline"]) & set(outputs["speculative"])
    assert shared and all(outputs["baseline"][p] == outputs["speculative"][p] for p in shared)  # lossless, greedy
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "NO-GO" and report["exit_code"] == proc.returncode
    # transformers serve 5.25 counts usage per generate() step: under prompt lookup a step commits several
    # tokens, so the speculative arm's usage undercounts; the re-tokenized cross-check and the gate catch it
    spec_records = [json.loads(line) for run in runs if run["arm"] == "speculative"
                    for line in (out / run["raw"]).read_text().splitlines()]
    assert any(r["osl_retok"] > r["osl"] + 1 for r in spec_records)
    spec_cell = next(c for c in report["cells"] if c["arm"] == "speculative")
    assert spec_cell["data_quality"]["osl_retok_mismatch"] > 0
    assert any(c["rule"] == "output_length_match" and c["status"] == "fail" for c in report["gate"]["checks"])
    settings = json.loads(next((out / "settings").glob("speculative-*")).read_text())
    assert settings["model_name"] == servers["speculative"]["model"]
