"""The config sections that are not the speculation method: LLM-API knobs, build limits, Triton,
sampling, load test, SLOs, gate and the CPU reference engine.

Reads and writes nothing; :mod:`pipeline.config.deployment` puts them together.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from pipeline.config_base import CrossFieldError, Section, described
from pipeline.errors import UsageError
from pipeline.loadtest.datasets import FORMATS


class LlmApiSettings(Section):
    """LLM-API runtime knobs (``trtllm_runtime: llm_api``): the arguments of TensorRT-LLM's ``LLM``
    that go into the Triton llmapi ``model.yaml`` and the ``trtllm-serve`` options file."""

    cuda_graphs: bool = described(
        "CUDA graphs for decode batches up to build.max_batch_size (cuda_graph_config).", default=True
    )
    cuda_graph_padding: bool = described(
        "Pad a batch up to the next captured size (cuda_graph_config.enable_padding).", default=True
    )
    disable_overlap_scheduler: bool = described("Turn the PyTorch executor's overlap scheduler off.", default=False)
    modelopt_root: str | None = described(
        "NVIDIA Model-Optimizer checkout whose examples/llm_ptq/hf_ptq.py quantizes checkpoints for this "
        "runtime (quantization.format fp8 / int4_awq). Unset: $SPECDEPLOY_MODELOPT_ROOT, then ./Model-Optimizer "
        "under the working directory (docs/gpu-llmapi.md).",
        default=None,
    )
    extra_llm_args: dict[str, Any] = described(
        "More LLM arguments, merged over the generated ones; validate checks every key and type against "
        "the recorded facts of trtllm_version (pipeline/trtllm/llmapi_facts.yaml).",
        default_factory=dict,
    )
    extra_speculative_config: dict[str, Any] = described(
        "More speculative_config fields of the method's decoding_type, merged over the generated ones; "
        "checked like extra_llm_args.",
        default_factory=dict,
    )


class BuildLimits(Section):
    """Engine build limits (trtllm-build); the baseline and speculative engines share them."""

    max_batch_size: Annotated[int, Field(ge=1, le=4096)] = described(
        "--max_batch_size (EAGLE ≤ 512; Triton max_batch_size ≤ this).", default=8
    )
    max_input_len: Annotated[int, Field(ge=1)] = described("--max_input_len: longest prompt in tokens.", default=1024)
    max_seq_len: Annotated[int, Field(ge=2)] = described(
        "--max_seq_len: prompt + generated tokens (speculative engines add max_draft_len).", default=2048
    )
    max_num_tokens: Annotated[int, Field(ge=1)] = described(
        "--max_num_tokens per engine step (raised to max_batch_size × (K+1) for speculation).", default=8192
    )
    max_beam_width: Annotated[int, Field(ge=1, le=8)] = described(
        "--max_beam_width; speculative decoding needs 1.", default=1
    )
    gather_generation_logits: bool = described(
        "--gather_generation_logits on both draft-target engines (needed for use_draft_logits).", default=False
    )
    workers: Annotated[int, Field(ge=1)] | None = described(
        "trtllm-build --workers; default TP×PP.", default=None
    )

    @model_validator(mode="after")
    def _lengths_consistent(self) -> "BuildLimits":
        if self.max_input_len >= self.max_seq_len:
            raise CrossFieldError(
                [
                    (
                        "build.max_input_len",
                        f"max_input_len ({self.max_input_len}) must be below max_seq_len "
                        f"({self.max_seq_len}) to leave room for generated tokens",
                    )
                ]
            )
        return self


class TritonSettings(Section):
    """Triton server and tensorrt_llm model parameters."""

    host: str = described(
        "Address the server binds and clients use. 0.0.0.0 exposes every port (inference, metrics) to "
        "the network, without authentication: only on a trusted network (docs/gpu-serving.md).",
        default="127.0.0.1",
    )
    http_port: Annotated[int, Field(ge=1, le=65535)] = described("HTTP port.", default=8000)
    grpc_port: Annotated[int, Field(ge=1, le=65535)] = described("gRPC port.", default=8001)
    metrics_port: Annotated[int, Field(ge=1, le=65535)] = described("Prometheus metrics port.", default=8002)
    decoupled: bool = described(
        "Streaming (decoupled) tensorrt_llm model; forced false for draft-target's LLM models.", default=True
    )
    max_queue_delay_microseconds: Annotated[int, Field(ge=0)] = described(
        "Dynamic-batcher queue delay.", default=0
    )
    max_queue_size: Annotated[int, Field(ge=0)] = described("Request queue bound (0 = unbounded).", default=0)
    preprocessing_instance_count: Annotated[int, Field(ge=1, le=64)] = described(
        "Instances of the preprocessing model.", default=1
    )
    postprocessing_instance_count: Annotated[int, Field(ge=1, le=64)] = described(
        "Instances of the postprocessing model.", default=1
    )
    bls_instance_count: Annotated[int, Field(ge=1, le=64)] = described(
        "Instances of the tensorrt_llm_bls model.", default=1
    )
    kv_cache_free_gpu_mem_fraction: Annotated[float, Field(gt=0, le=1)] = described(
        "Fraction of a GPU's free memory that the KV caches on it may take together; render splits it "
        "evenly among the TensorRT-LLM models sharing that GPU (both arms, the draft).",
        default=0.9,
    )
    max_tokens_in_paged_kv_cache: Annotated[int, Field(gt=0)] | None = described(
        "KV-cache capacity in tokens of every tensorrt_llm model of both arms (equal capacity); "
        "unset: sized from the memory estimate so both arms get the same.",
        default=None,
    )
    max_attention_window_size: Annotated[int, Field(gt=0)] | None = described(
        "Tokens each generated token attends to (sliding window when below build.max_seq_len); "
        "unset: the whole sequence.",
        default=None,
    )
    enable_chunked_context: bool = described(
        "Split long prompts into chunks batched with generation steps (needs paged context FMHA; "
        "not with EAGLE).",
        default=False,
    )
    gpus: list[Annotated[int, Field(ge=0)]] | None = described(
        "GPU indexes (as nvidia-smi lists them) the deployment may use; unset: every GPU nvidia-smi "
        "lists when rendering, or the fewest the deployment needs without nvidia-smi.",
        default=None,
    )
    arm_placement: Literal["auto", "split", "shared", "sequential"] = described(
        "How the load test's two arms share the GPUs: split (disjoint GPUs), shared (co-resident, "
        "equal KV capacity), sequential (one at a time, restarted between runs); auto picks the first "
        "that fits in that order.",
        default="auto",
    )
    batching_strategy: Literal["inflight_fused_batching", "inflight_batching", "V1"] = described(
        "tensorrt_llm gpt_model_type.", default="inflight_fused_batching"
    )
    batch_scheduler_policy: Literal["max_utilization", "guaranteed_no_evict"] = described(
        "Batch scheduler policy.", default="guaranteed_no_evict"
    )
    enable_kv_cache_reuse: bool = described(
        "KV-cache block reuse (needs paged context FMHA; required by draft-target).", default=True
    )
    exclude_input_in_output: bool = described("Return only generated tokens.", default=False)
    container_image: str = described(
        "NGC image for the GPU path (build and serve in the same image).",
        default="nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3",
    )
    startup_timeout_s: Annotated[float, Field(gt=0)] = described("Seconds to wait for readiness.", default=180.0)
    exit_timeout_s: Annotated[float, Field(gt=0)] = described("Seconds to wait for a clean shutdown.", default=5.0)

    @model_validator(mode="after")
    def _distinct_ports(self) -> "TritonSettings":
        ports = {"http_port": self.http_port, "grpc_port": self.grpc_port, "metrics_port": self.metrics_port}
        seen: dict[int, str] = {}
        problems = []
        for name, port in ports.items():
            if port in seen:
                problems.append((f"triton.{name}", f"port {port} clashes with triton.{seen[port]}"))
            seen.setdefault(port, name)
        if self.gpus is not None and (not self.gpus or len(set(self.gpus)) != len(self.gpus)):
            problems.append(("triton.gpus", f"needs distinct GPU indexes, got {self.gpus}"))
        if problems:
            raise CrossFieldError(problems)
        return self


class Sampling(Section):
    """Sampling sent identically to both arms. top_k=1 (the default) is greedy, and so is temperature 0."""

    temperature: Annotated[float, Field(ge=0, le=10)] = described(
        "Sampling temperature; 0 is greedy (Triton: sent as top_k 1; OpenAI-compatible servers: temperature 0).",
        default=1.0)
    top_k: Annotated[int, Field(ge=0)] = described("Top-k (1 = greedy).", default=1)
    top_p: Annotated[float, Field(ge=0, le=1)] = described("Top-p (0 = off).", default=0.0)
    seed: Annotated[int, Field(ge=0)] = described("Per-request random seed base.", default=0)

    @property
    def greedy(self) -> bool:
        return self.top_k == 1 or self.temperature == 0 or (self.top_k == 0 and self.top_p <= 0)


class RampStep(Section):
    """One level of a ramp: a schedule of levels within one run (docs/arrivals-and-goodput.md)."""

    duration_s: Annotated[float, Field(gt=0)] = described("Seconds this level lasts.")
    rate: Annotated[float, Field(gt=0)] | None = described("Open loop: requests/s during this level.", default=None)
    users: Annotated[int, Field(ge=1, le=4096)] | None = described(
        "Closed loop: users (requests in flight) during this level.", default=None)


ARRIVALS = ("poisson", "constant", "gamma", "trace")


class LoadTestSettings(Section):
    """Load-test plan: both arms, every concurrency level, repeated runs."""

    transport: Literal["grpc", "http", "openai"] = described(
        "gRPC streaming, HTTP generate_stream, or an OpenAI-compatible server's streaming /v1 API.", default="grpc"
    )
    openai_api: Literal["completions", "chat"] = described(
        "Transport openai: /v1/completions (the prompt as text) or /v1/chat/completions (one user message).",
        default="completions",
    )
    openai_top_k: bool | None = described(
        "Transport openai: send sampling.top_k. Unset: greedy (top_k 1) goes as temperature 0 without top_k, any "
        "other top_k is sent; true: always sent (vLLM, SGLang, trtllm-serve take it); false: never (strict servers "
        "refuse the field; docs/openai-endpoints.md).", default=None,
    )
    fail_fast_error_rate: Annotated[float, Field(ge=0, lt=1)] | None = described(
        "Stop the load test before the sweep goes on when more than this fraction of the requests sent in a "
        "run's first fail_fast_window_s seconds fail (null: never stop early).", default=0.5,
    )
    fail_fast_window_s: Annotated[float, Field(gt=0)] = described(
        "Seconds from a run's start that fail_fast_error_rate watches.", default=10.0,
    )
    mode: Literal["closed", "open"] = described("Closed loop (fixed users) or open loop (request rate).", default="closed")
    concurrency: list[Annotated[int, Field(ge=1, le=4096)]] = described(
        "Concurrency levels (closed loop), sorted, no repeats.", default_factory=lambda: [1, 2, 4, 8]
    )
    request_rate: list[Annotated[float, Field(gt=0)]] = described(
        "Open loop: requests/s per level.", default_factory=list
    )
    duration_s: Annotated[float, Field(gt=0)] = described("Measured seconds per cell.", default=20.0)
    warmup_s: Annotated[float, Field(ge=0)] = described("Warm-up seconds excluded from statistics.", default=2.0)
    repeats: Annotated[int, Field(ge=1, le=50)] | Literal["auto"] = described(
        "Runs per cell (arms interleaved), or auto: add interleaved repeats until every gated check is decided, "
        "between min_repeats and max_repeats and within max_minutes (alpha split over the looks; docs/report.md).",
        default=3,
    )
    min_repeats: Annotated[int, Field(ge=2, le=50)] = described(
        "repeats: auto: the first look at the verdict is after this many repeats.", default=3,
    )
    max_repeats: Annotated[int, Field(ge=2, le=50)] = described(
        "repeats: auto: never more repeats than this (the looks between min_repeats and max_repeats share alpha).",
        default=8,
    )
    max_minutes: Annotated[float, Field(gt=0)] | None = described(
        "repeats: auto: start no repeat that would end the measurement after this many minutes (null: no limit).",
        default=60.0,
    )
    max_tokens: Annotated[int, Field(ge=1)] = described("Tokens generated per request.", default=64)
    prompts: str = described(
        "Directory of <category>.jsonl prompt files, or one file.", default="prompts"
    )
    categories: list[str] = described("Prompt categories to use; empty = all found.", default_factory=list)
    sampling: Sampling = described("Sampling parameters for both arms.", default_factory=Sampling)
    processes: Annotated[int, Field(ge=1, le=64)] = described("Locust worker processes.", default=1)
    stop_timeout_s: Annotated[float, Field(ge=0)] = described("Seconds to let in-flight requests finish.", default=30.0)
    sweep_draft_len: list[Annotated[int, Field(ge=1, le=32)]] = described(
        "Draft-target: num_draft_tokens values to sweep (each ≤ the engine max_draft_len).",
        default_factory=list,
    )
    seed: int = described("Seed for prompt order and user arrival.", default=1234)
    # arrivals, reach (issue 46; docs/arrivals-and-goodput.md)
    arrival: Literal["poisson", "constant", "gamma", "trace"] = described(
        "Open loop: how requests arrive at each request_rate: poisson (exponential gaps), constant (1/rate apart), "
        "gamma (gaps of shape `burstiness`, vLLM's --burstiness), trace (each prompt's own arrival_s, from the "
        "dataset: replayed as recorded).", default="poisson")
    burstiness: Annotated[float, Field(gt=0)] = described(
        "arrival gamma: the gamma shape (vLLM's --burstiness): 1 is Poisson, below 1 burstier, above 1 steadier; "
        "the mean rate stays request_rate.", default=1.0)
    max_concurrency: Annotated[int, Field(ge=1, le=4096)] | None = described(
        "Open loop: at most this many requests in flight (vLLM's --max-concurrency); an arrival beyond it waits "
        "for a free slot, so the achieved rate can fall below request_rate (the report says so).", default=None)
    ramp: list[RampStep] = described(
        "A schedule of levels within one run, in order (open loop: `rate` per step; closed loop: `users`); "
        "replaces request_rate / concurrency levels, and the run lasts the steps' total.", default_factory=list)
    headers: dict[str, str] = described(
        "HTTP headers sent with every request (gRPC: as metadata); recorded in the run's files: put secrets in "
        "api_key_env instead.", default_factory=dict)
    api_key_env: str | None = described(
        "Environment variable holding an API key, sent as `Authorization: Bearer <key>`; never written to a file. "
        "Unset: OPENAI_API_KEY for transport openai when it is set, else no key.", default=None)
    extra_body: dict[str, Any] = described(
        "Server-specific request fields merged into every request body (OpenAI JSON; Triton: extra inputs), "
        "e.g. {ignore_eos: true} for vLLM (vLLM's --extra-body).", default_factory=dict)
    # Datasets and lengths (docs/workload.md); the names are vLLM bench serve's and AIPerf's
    dataset_name: str = described(
        "Format of dataset_path: specdeploy (our {id, category, prompt} JSONL; alias custom), sharegpt, "
        "openai_chat, hf (a Hugging Face dataset on disk), spec_bench, speed_bench, mooncake_trace.",
        default="specdeploy",
    )
    dataset_path: str | None = described(
        "The dataset file or directory (unset: prompts). For mooncake_trace, prompts is the text the trace's "
        "prompts are cut from.", default=None,
    )
    prompt_column: str = described("dataset_name hf: the prompt's column (text, or a list of messages).",
                                   default="prompt")
    category_column: str | None = described(
        "dataset_name hf: the category's column (unset: 'category' when there is one).", default=None)
    multi_turn: bool = described(
        "Conversations (sharegpt, openai_chat, speed_bench, hf chat columns): send the history up to the last "
        "user turn instead of the first user turn alone.", default=False,
    )
    num_prompts: Annotated[int, Field(ge=1)] | None = described(
        "Prompts drawn from the dataset (seeded; the same in both arms), cycled through by every cell; more than "
        "the dataset holds repeats rows. Unset: all.", default=None,
    )
    input_len: str | None = described(
        "Input length in the target's tokens: 128, 64:256 (uniform), normal:MEAN,SD[,MIN,MAX], "
        "lognormal:MEAN,SD[,MIN,MAX] or dataset; prompts are cut from the dataset's real text. Unset: as written.",
        default=None,
    )
    output_len: str | None = described(
        "Output length per request (its max_tokens), written like input_len; dataset: the recorded answer's or "
        "the trace's length. Unset: max_tokens for every request.", default=None,
    )
    ignore_eos: bool = described(
        "Force every output to its full length (OpenAI: ignore_eos and min_tokens; Triton: min_tokens). Forced "
        "lengths bias acceptance: the report says so.", default=False,
    )

    @field_validator("input_len", "output_len", mode="before")
    @classmethod
    def _length_written(cls, value: Any, info) -> Any:
        if value is None:
            return None
        from pipeline.loadtest.lengths import parse_length  # noqa: PLC0415 - start-up: numpy (pipeline.loadtest.lengths; every command parses a config)

        try:
            parse_length(value, info.field_name)
        except UsageError as exc:  # pydantic reports a ValueError with the field's path
            raise ValueError(str(exc).split(": ", 1)[1]) from None
        return str(value)

    @field_validator("dataset_name")
    @classmethod
    def _dataset_known(cls, value: str) -> str:

        if value not in FORMATS:
            raise ValueError(f"unknown dataset format '{value}' (one of "
                             f"{', '.join(sorted({f.name for f in FORMATS.values()}))})")
        return FORMATS[value].name

    @field_validator("concurrency")
    @classmethod
    def _concurrency_sorted_unique(cls, value: list[int]) -> list[int]:
        if not value:
            raise ValueError("needs at least one concurrency level")
        if len(set(value)) != len(value):
            raise ValueError(f"concurrency levels repeat: {value}")
        return sorted(value)

    @model_validator(mode="after")
    def _open_loop_needs_rates(self) -> "LoadTestSettings":
        problems = []
        if self.mode == "open" and not self.request_rate and not self.ramp and self.arrival != "trace":
            problems.append(("loadtest.request_rate", "mode 'open' needs request_rate levels (requests/s), a ramp "
                             "or arrival: trace"))
        problems += self._arrival_problems()
        if self.min_repeats > self.max_repeats:
            problems.append(("loadtest.min_repeats",
                             f"min_repeats ({self.min_repeats}) must not exceed max_repeats ({self.max_repeats})"))
        if self.warmup_s >= self.run_seconds:
            problems.append(
                ("loadtest.warmup_s", f"warmup_s ({self.warmup_s}) must be shorter than duration_s ({self.run_seconds})")
            )
        if problems:
            raise CrossFieldError(problems)
        return self

    @property
    def run_seconds(self) -> float:
        """Seconds one run lasts: duration_s, or a ramp's steps together."""
        return sum(step.duration_s for step in self.ramp) if self.ramp else self.duration_s

    def _arrival_problems(self) -> list[tuple[str, str]]:
        """Arrival options that contradict each other or the mode, each named."""
        out = []
        open_loop = self.mode == "open"
        if not open_loop and self.arrival != "poisson":
            out.append(("loadtest.arrival", f"arrival '{self.arrival}' is an open-loop schedule: set mode: open "
                        "(closed loop sends the next request when one finishes)"))
        if self.burstiness != 1.0 and self.arrival != "gamma":
            out.append(("loadtest.burstiness", f"burstiness {self.burstiness:g} needs arrival: gamma "
                        "(1 is Poisson)"))
        if self.max_concurrency is not None and not open_loop:
            out.append(("loadtest.max_concurrency", "closed loop: the concurrency levels are the cap; "
                        "max_concurrency caps an open-loop rate"))
        if self.arrival == "trace" and (self.request_rate or self.ramp):
            out.append(("loadtest.arrival", "arrival: trace replays the dataset's own arrival times: drop "
                        "request_rate and ramp"))
        for i, step in enumerate(self.ramp):
            wanted, other = ("rate", "users") if open_loop else ("users", "rate")
            if getattr(step, wanted) is None or getattr(step, other) is not None:
                out.append((f"loadtest.ramp.{i}", f"mode {self.mode}: each ramp step gives `{wanted}` "
                            f"(not `{other}`)"))
        if self.ramp and open_loop and self.request_rate:
            out.append(("loadtest.ramp", "a ramp replaces request_rate levels: give one or the other"))
        return out


class Slo(Section):
    """Service-level objectives both arms are held to: a request meets them when every bound set holds
    (goodput, vLLM's --goodput); each arm's percentile of each metric is also checked against its bound."""

    ttft_ms: Annotated[float, Field(gt=0)] | None = described(
        "Time-to-first-token bound (ms); null: not an SLO.", default=1000.0)
    tpot_ms: Annotated[float, Field(gt=0)] | None = described(
        "Time-per-output-token bound (ms); null: not an SLO.", default=100.0)
    e2e_ms: Annotated[float, Field(gt=0)] | None = described(
        "End-to-end latency bound (ms; vLLM's e2el); null: not an SLO.", default=None)
    percentile: Annotated[float, Field(gt=0, le=100)] = described(
        "The percentile of each metric the report checks against its bound (per arm and level).", default=95.0)
    declared: bool = described(
        "These SLOs are the user's (set when gate.slo is written or --goodput given): goodput at the SLO goes "
        "on the report's first screen and the goodput guardrail gates.", default=False)

    @model_validator(mode="before")
    @classmethod
    def _declared_when_written(cls, data):
        # a written gate.slo is the user's SLO; a snapshot (run.json) carries `declared` as recorded
        if isinstance(data, dict) and "declared" not in data and data:
            return {**data, "declared": True}
        return data


class GateSettings(Section):
    """The rollout gate (docs/report.md). Thresholds are product settings."""

    target_concurrency: list[Annotated[int, Field(ge=1)]] = described(
        "Concurrency levels the verdict is decided at (must be load-test levels); empty = the lowest.",
        default_factory=list,
    )
    tpot_ratio_max: Annotated[float, Field(gt=0)] = described(
        "GO needs the CI upper bound of spec/base median TPOT below this.", default=0.9
    )
    e2e_ratio_max: Annotated[float, Field(gt=0)] = described("Same for end-to-end latency.", default=0.9)
    ttft_p95_delta_ms_max: Annotated[float, Field(ge=0)] = described(
        "Allowed p95 TTFT regression in ms.", default=250.0
    )
    ttft_p95_delta_pct_max: Annotated[float, Field(ge=0)] = described(
        "Allowed p95 TTFT regression in percent.", default=50.0
    )
    peak_throughput_ratio_min: Annotated[float, Field(gt=0)] = described(
        "Peak throughput of spec ÷ base must stay above this.", default=0.95
    )
    max_error_rate_delta: Annotated[float, Field(ge=0, le=1)] = described(
        "Allowed increase of the error rate.", default=0.001
    )
    min_requests_per_cell: Annotated[int, Field(ge=1)] = described(
        "Fewer requests in a cell → INCONCLUSIVE.", default=20
    )
    min_runs: Annotated[int, Field(ge=1)] = described("Fewer repeated runs → INCONCLUSIVE.", default=2)
    min_acceptance_rate: Annotated[float, Field(ge=0, le=1)] = described(
        "Acceptance rate below this is a warning (speculation usually does not pay there); the verdict follows the "
        "measured benefit unless acceptance_is_gate.", default=0.5
    )
    acceptance_is_gate: bool = described(
        "Acceptance below min_acceptance_rate fails the gate (NO-GO), e.g. to guard traffic unlike the measured "
        "prompt mix.", default=False
    )
    require_output_equivalence: bool = described(
        "Greedy outputs of both arms must match (exactly on CPU).", default=True
    )
    achieved_concurrency_tolerance: Annotated[float, Field(ge=0, le=1)] = described(
        "Relative shortfall of achieved vs requested concurrency tolerated.", default=0.05
    )
    allow_cutoff_above_crossover: bool = described(
        "Peak-throughput guardrail passes when every target level is below the crossover and the "
        "rollout disables speculation from the crossover up.",
        default=True,
    )
    slo: Slo = described("Latency SLOs.", default_factory=Slo)
    goodput_ratio_min: Annotated[float, Field(gt=0)] = described(
        "With declared SLOs: goodput (requests/s meeting every SLO) of spec ÷ base must have its CI lower bound "
        "above this at the gated levels.", default=0.95)
    achieved_rate_tolerance: Annotated[float, Field(ge=0, le=1)] = described(
        "Open loop: relative gap of the achieved send rate from the schedule's tolerated.", default=0.05)
    bootstrap_resamples: Annotated[int, Field(ge=100)] = described(
        "Bootstrap resamples for the pooled request-level CIs (descriptive; the gate uses paired t intervals).",
        default=9999)
    bootstrap_seed: int = described("Bootstrap seed.", default=0)
    alpha: Annotated[float, Field(gt=0, lt=1)] = described("Significance level (CI = 1 − alpha).", default=0.05)


class ReferenceEngineSettings(Section):
    """CPU reference engine knobs (backend: reference)."""

    threads: Annotated[int, Field(ge=1, le=64)] = described("torch threads per engine process.", default=1)
    max_batch_size: Annotated[int, Field(ge=1, le=256)] | None = described(
        "In-flight batch limit; default build.max_batch_size.", default=None
    )
    prefix_cache_entries: Annotated[int, Field(ge=0, le=4096)] = described(
        "Cached prompt prefixes (KV reuse).", default=64
    )
    compute_dtype: Literal["float32", "float64"] = described("Compute dtype of the reference engine.", default="float32")
    draft_weights: Literal["float", "int8"] = described(
        "Draft-side weights at load (draft model, Medusa heads, EAGLE head) of the speculative engine: "
        "float = as the checkpoint stores them, or int8 — weight-only, per output channel, run by a "
        "few-row int8 kernel. Cheaper draft steps on CPU; the output is unchanged (drafts only decide "
        "what is accepted), acceptance may move a little. `specdeploy bench --draft-int8` measures both. "
        "Where torch's int8 GEMM is slow on the CPU (seen on AVX2-only hosts) the same integers run in an exact "
        "float GEMM (docs/reference-engine.md; SPECDEPLOY_INT8_GEMM forces a kernel). "
        "float32 compute only; with draft-target orchestration: bls the served draft engine stays float.",
        default="float",
    )
    fast_paths: bool = described(
        "CPU fast path of the engine: scripted kernels, fused one-row drafting steps, int8 packing "
        "for draft-side weights. The same maths as the plain path (tests keep the two equal; the "
        "output does not change), only faster; false runs the plain reference maths, for reading "
        "or checking them.",
        default=True,
    )
    cpu_pinning: Literal["auto", "off"] | list[Annotated[int, Field(ge=0)]] = described(
        "Serving only. auto = each engine model's decode thread (tensorrt_llm, and tensorrt_llm_draft "
        "with orchestration: bls) gets `threads` CPUs of its own, the highest allowed ones, and "
        "tritonserver, the other models and the load generator run on the rest — when at least one "
        "CPU is left for them; otherwise nothing is pinned. A list of CPU ids = the engines' CPUs "
        "(`threads` per engine model, in order); the rest run everything else. off = the OS "
        "schedules everything. The serve log names the plan.",
        default="auto",
    )

    engine_process: Literal["own", "stub"] = described(
        "Serving only. own = each engine model's engine runs in a worker process of its own "
        "(`python -m pipeline.reference.worker`, started and stopped by the model), so its decode "
        "loop shares no interpreter lock with the threads that send responses; stub = inside the "
        "Python-backend stub process.",
        default="own",
    )

    @field_validator("cpu_pinning", mode="before")
    @classmethod
    def _cpu_pinning_value(cls, value):
        # one message instead of one per union member
        if isinstance(value, str) and value in ("auto", "off"):
            return value
        if isinstance(value, list) and value and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in value):
            return value
        raise ValueError(f"should be 'auto', 'off' or a non-empty list of CPU ids (integers ≥ 0), got {value!r}")


class CapacitySettings(Section):
    """Capacity and cost in every report (docs/capacity.md): replicas, GPUs and cost per million output
    tokens at gate.slo, with and without speculation, from the run's measured curves."""

    rate_rps: Annotated[float, Field(gt=0)] | None = described(
        "Target request rate (requests/s) to size for; or daily_profile.", default=None)
    daily_profile: list[Annotated[float, Field(ge=0)]] = described(
        "24 hourly request rates (requests/s) of a day, instead of rate_rps.", default_factory=list)
    gpu_hour_usd: Annotated[float, Field(ge=0)] | None = described(
        "Price per GPU-hour (USD); without it GPUs are sized but not priced.", default=None)
    gpus_per_replica: Annotated[int, Field(ge=1)] | None = described(
        "GPUs per replica (default: the target's tp × pp; 1 on the CPU).", default=None)
    percentile: Annotated[float, Field(ge=50, le=100)] = described(
        "The percentile gate.slo's limits are held at for sizing.", default=95.0)

    @model_validator(mode="after")
    def _one_demand(self) -> "CapacitySettings":
        if (self.rate_rps is None) == (not self.daily_profile):
            raise CrossFieldError([("capacity.rate_rps", "give rate_rps or daily_profile (24 hourly rates), one of them")])
        if self.daily_profile and len(self.daily_profile) != 24:
            raise CrossFieldError([("capacity.daily_profile", f"24 hourly rates, got {len(self.daily_profile)}")])
        return self
