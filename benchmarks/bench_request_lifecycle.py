"""Stress benchmark for issue 44, "every request ends" (not a CI test): many short requests with
external draft tokens against a real served tiny draft-target deployment, on a loaded machine;
counts the requests that never end.

The clients reuse one ``request_id`` per client for every call, as upstream's
``inflight_batcher_llm/client/e2e_grpc_speculative_decoding_client.py`` (tensorrtllm_backend
r25.05) does for every round's draft and target calls. Per client thread, in a loop:

- a speculative round, unary (the upstream client's calls): ``tensorrt_llm_draft`` proposes K
  tokens, ``tensorrt_llm`` verifies them as ``draft_input_ids``, both under the client's id;
- the same verify call streamed on a gRPC stream (``streaming`` true), under the same id;
- one ``tensorrt_llm_bls`` request with ``num_draft_tokens`` (the BLS's own draft/target rounds).

Every call has a client timeout (``--timeout-s``); a call that reaches it is a hang. Optional
CPU burners (``--burners``: busy Python processes, killed by pid at the end) load the machine.
Both orchestrations (``--orchestration bls engine``): separate deployments of the same tiny
models (tests/integration/tiny_deploy.py), each on its own server.

Usage (from the project root, or from another checkout to measure its code)::

    .venv/bin/python benchmarks/bench_request_lifecycle.py --runs 5 --seconds 60 --clients 6 --burners 1

Prints one JSON line per run and a summary; ``--out FILE`` writes them as JSON. A run whose
``tritonserver`` died is recorded as such and the next run gets a new server. The figures before
and after the fix of issue 44 are in ``benchmarks/results/request-lifecycle.json`` (the old code
was run from an export of its commit, with this file copied next to it).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "integration"))

import tiny_deploy  # noqa: E402 - tests/integration, on sys.path above
from pipeline.config import load_config  # noqa: E402 - the checkout this file is in, on sys.path above
from pipeline.render.renderer import render  # noqa: E402 - as above
from pipeline.serve.server import start_deployment  # noqa: E402 - as above

K = 3
BURN = "while True: pass"


def _tensor(name: str, array: np.ndarray):
    tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def llm_inputs(context: list[int], output_len: int, drafts: list[int] | None, streaming: bool = False) -> list:
    inputs = [_tensor("input_ids", np.array([context], dtype=np.int32)),
              _tensor("input_lengths", np.array([[len(context)]], dtype=np.int32)),
              _tensor("request_output_len", np.array([[output_len]], dtype=np.int32)),
              _tensor("end_id", np.array([[-1]], dtype=np.int32))]
    if drafts:
        inputs.append(_tensor("draft_input_ids", np.array([drafts], dtype=np.int32)))
    if streaming:
        inputs.append(_tensor("streaming", np.array([[True]])))
    return inputs


def bls_inputs(prompt: str, max_tokens: int) -> list:
    return [_tensor("text_input", np.array([[prompt]], dtype=object)),
            _tensor("max_tokens", np.array([[max_tokens]], dtype=np.int32)),
            _tensor("num_draft_tokens", np.array([[K]], dtype=np.int32)),
            _tensor("stream", np.array([[True]]))]


class Client:
    """One client thread's tritonclient connection and its one request id."""

    def __init__(self, url: str, name: str, timeout_s: float):
        self.name, self.timeout_s = name, timeout_s
        self.client = grpcclient.InferenceServerClient(url)
        self.results: "queue.Queue" = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def unary(self, model: str, inputs: list, decoupled: bool) -> np.ndarray:
        """One response's output_ids: ModelInfer, or the stream API for a decoupled model."""
        if decoupled:
            return self.stream(model, inputs)[-1].as_numpy("output_ids").reshape(-1)
        result = self.client.infer(model, inputs, request_id=self.name, client_timeout=self.timeout_s)
        return result.as_numpy("output_ids").reshape(-1)

    def stream(self, model: str, inputs: list) -> list:
        """Send one request on the open stream; wait for its final response (TimeoutError: hang).
        The responses with outputs."""
        self.client.async_stream_infer(model, inputs, request_id=self.name, enable_empty_final_response=True)
        deadline, responses = time.monotonic() + self.timeout_s, []
        while True:
            try:
                result, error = self.results.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"{self.name}: no final response within {self.timeout_s} s") from None
            if error is not None:
                raise error
            if result.get_response().outputs:
                responses.append(result)
            if result.get_response().parameters["triton_final_response"].bool_param:
                return responses

    def close(self) -> None:
        self.client.stop_stream(cancel_requests=True)
        self.client.close()


def client_loop(url: str, name: str, prompt_ids: list[int], until: float, timeout_s: float, tally: Counter,
                lock: threading.Lock, models: dict[str, bool], errors: Counter) -> None:
    """``models``: name → decoupled. The target's "stream" call goes on the gRPC stream, with
    ``streaming`` when the target is decoupled (one response otherwise)."""
    client = Client(url, name, timeout_s)
    try:
        step = 0
        while time.monotonic() < until:
            step += 1
            context = prompt_ids[: 4 + step % 12]
            kinds = []
            try:
                drafts = None
                if "tensorrt_llm_draft" in models:
                    kinds.append("draft")
                    out = client.unary("tensorrt_llm_draft", llm_inputs(context, K, None), models["tensorrt_llm_draft"])
                    drafts = [int(t) for t in out[len(context):]]
                else:
                    drafts = [int(t) for t in prompt_ids[:K]]
                kinds.append("target-unary")
                client.unary("tensorrt_llm", llm_inputs(context, len(drafts) + 1, drafts), models["tensorrt_llm"])
                kinds.append("target-stream")
                client.stream("tensorrt_llm", llm_inputs(context, len(drafts) + 1, drafts,
                                                         streaming=models["tensorrt_llm"]))
                if "tensorrt_llm_bls" in models and step % 3 == 0:
                    kinds.append("bls")
                    client.stream("tensorrt_llm_bls", bls_inputs("def add(a, b):", 8))
                outcome = "ok"
            except Exception as exc:  # noqa: BLE001 - classified and counted
                text = str(exc)
                outcome = "hang" if ("Deadline" in text or "timeout" in text.lower()
                                     or isinstance(exc, TimeoutError)) else "error"
                with lock:
                    tally[f"{outcome}:{kinds[-1] if kinds else '?'}"] += 1
                    errors[text[:200]] += 1
                if outcome == "hang":
                    client.close()
                    client = Client(url, name, timeout_s)
                continue
            with lock:
                tally[outcome] += 1
                tally["calls"] += len(kinds)
    finally:
        client.close()


def deploy(workdir: Path, orchestration: str):
    models = tiny_deploy.make_models(workdir / "models")
    cfg_path = tiny_deploy.make_deployment(workdir, models, "draft_target", name=f"stress-{orchestration}",
                                           orchestration=orchestration)
    cfg = load_config(cfg_path, workdir)
    render(cfg)
    server = start_deployment(cfg, "speculative")
    return server, models


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--burners", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=30.0)
    parser.add_argument("--orchestration", nargs="+", default=["bls", "engine"], choices=["bls", "engine"])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="specdeploy-lifecycle-"))
    workdir.mkdir(parents=True, exist_ok=True)
    os.chdir(workdir)  # the later stages read the workdir as cwd, as the CLI does
    records = []
    for orchestration in args.orchestration:
        server, _models = deploy(workdir, orchestration)
        burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(args.burners)]
        try:
            probe = grpcclient.InferenceServerClient(server.grpc_url)
            models = {m["name"]: bool(probe.get_model_config(m["name"], as_json=True)["config"]
                                      .get("model_transaction_policy", {}).get("decoupled"))
                      for m in probe.get_model_repository_index(as_json=True).get("models", [])}
            probe.close()
            from tokenizers import Tokenizer  # only here: the prompt's ids

            tok = Tokenizer.from_file(str(workdir / "models" / "tokenizer" / "tokenizer.json"))
            prompt_ids = tok.encode("The quick brown fox jumps over the lazy dog. def add(a, b):").ids
            for run in range(args.runs):
                tally: Counter = Counter()
                errors: Counter = Counter()
                lock = threading.Lock()
                until = time.monotonic() + args.seconds
                started = time.monotonic()
                threads = [threading.Thread(target=client_loop, args=(server.grpc_url, f"client-{run}-{n}", prompt_ids,
                                                                      until, args.timeout_s, tally, lock, models, errors))
                           for n in range(args.clients)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                hangs = sum(v for k, v in tally.items() if k.startswith("hang"))
                alive = server.alive()
                record = {"orchestration": orchestration, "run": run, "seconds": round(time.monotonic() - started, 1),
                          "clients": args.clients, "burners": args.burners, "server_alive": alive,
                          "hangs": hangs, **dict(tally), "errors": dict(errors.most_common(5))}
                records.append(record)
                print(json.dumps(record), flush=True)
                if not alive:  # tritonserver died (its log says why): the next run gets a new one
                    server.stop()
                    server, _models = deploy(workdir, orchestration)
        finally:
            for burner in burners:
                burner.kill()
                burner.wait()
            server.stop()
    summary = {orch: {"runs": sum(1 for r in records if r["orchestration"] == orch),
                      "server_died": sum(1 for r in records if r["orchestration"] == orch and not r["server_alive"]),
                      "runs_with_a_hang": sum(1 for r in records if r["orchestration"] == orch and r["hangs"]),
                      "hangs": sum(r["hangs"] for r in records if r["orchestration"] == orch),
                      "rounds_ok": sum(r.get("ok", 0) for r in records if r["orchestration"] == orch)}
               for orch in args.orchestration}
    print(json.dumps({"summary": summary}), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"records": records, "summary": summary}, indent=2) + "\n")
    return 1 if any(r["hangs"] for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
