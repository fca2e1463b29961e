"""``tensorrt_llm_bls``: pass-through to ``tensorrt_llm`` for non-speculative requests,
draft-target orchestration over ``tensorrt_llm_draft`` + ``tensorrt_llm`` (docs/triton-contract.md,
`tensorrt_llm_bls`), and n-gram drafts looked up here and verified by ``tensorrt_llm`` as external
drafts (:mod:`.ngram_bls`, docs/ngram.md) when the config's ``speculative_method`` is ``ngram``.

Reads the request's tensors and, once at start-up, the configs of its sibling models in the
repository (decoupled policy, the postprocessing tokenizer, the target engine's
``max_draft_len``); writes responses and the ``specdeploy_*`` counters (:mod:`.metrics`).

On the wire it answers as upstream's BLS (tensorrtllm_backend@r25.05
``all_models/inflight_batcher_llm/tensorrt_llm_bls/1/{model.py,lib/decode.py,lib/triton_decoder.py}``):
``text_output`` is the postprocessing ``OUTPUT`` tensor unchanged, one string per (row × beam),
so ``[1]`` per response; the other outputs are the target's, passed through (``[1, 1]`` perf
outputs, ``batch_index`` when the batch is > 1). A batch > 1 is forwarded to a decoupled target
and answered with one response stream per row, tagged with ``batch_index``.

A client that goes away (gRPC cancellation, HTTP disconnect) is noticed between two target
responses: the pass-through sends the target a ``stop`` under the id it gave the call (as upstream
stops a call on a stop word), and the draft-target rounds stop after the round in flight.

Speculative requests (``num_draft_tokens`` K > 0) run the rounds of :mod:`.draft_target` (or of
:mod:`.ngram_bls`);
a K above the target engine's ``max_draft_len`` is refused before any model runs. Each instance
serves one request at a time (concurrent BLS calls from several threads of one stub crash
tritonserver 2.51); concurrency comes from instances."""

from __future__ import annotations

import json
import re
import sys
import uuid
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from pipeline.triton_models import io, request_rules
from pipeline.triton_models.cpu_engine_model import SWITCH_INTERVAL_S
from pipeline.triton_models.draft_target import PERF_NAMES, DraftTarget, SpecError
from pipeline.triton_models.llm import BATCH_NEEDS_DECOUPLED, STREAMING_NEEDS_DECOUPLED
from pipeline.triton_models.metrics import RequestLatency, SpecDecodeCounters
from pipeline.triton_models.ngram_bls import NgramDraftTarget, ngram_settings

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
PASSTHROUGH_OUTPUTS = [*PERF_NAMES,
    "cum_log_probs", "output_log_probs", "context_logits", "generation_logits",
    "batch_index", "sequence_index", "num_input_tokens", "num_output_tokens",
]
# client input → tensorrt_llm input, forwarded unchanged when present
SAMPLING_INPUTS = {
    "top_k": "runtime_top_k", "top_p": "runtime_top_p", "temperature": "temperature",
    "length_penalty": "len_penalty", "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
    "seed": "seed", "beam_width": "beam_width",
}
PASSTHROUGH_INPUTS = {
    "min_tokens": "min_tokens", "return_log_probs": "return_log_probs",
    "return_context_logits": "return_context_logits", "return_generation_logits": "return_generation_logits",
    "return_perf_metrics": "return_perf_metrics", "return_num_input_tokens": "return_num_input_tokens",
    "return_num_output_tokens": "return_num_output_tokens", "num_return_sequences": "num_return_sequences",
    "exclude_input_in_output": "exclude_input_in_output", "lora_task_id": "lora_task_id",
    "lora_weights": "lora_weights", "lora_config": "lora_config",
    "prompt_embedding_table": "prompt_embedding_table", "prompt_vocab_size": "prompt_vocab_size",
    "guided_decoding_guide_type": "guided_decoding_guide_type", "guided_decoding_guide": "guided_decoding_guide",
}
# upstream's Request.validate text (lib/decode.py@r25.05)
MAX_TOKENS_RULE = "max_tokens must be a single value > 0"


class BlsError(Exception):
    """A failed step; its text goes back to the client unchanged."""


def _model_is_decoupled(model_dir: Path) -> bool:
    config = model_dir / "config.pbtxt"
    if not config.is_file():
        return False
    match = re.search(r"decoupled:\s*(\w+)", config.read_text(encoding="utf-8"))
    return bool(match) and match.group(1).lower() in ("true", "1")


def _string_param(config_text: str, key: str) -> str | None:
    match = re.search(r'key:\s*"' + re.escape(key) + r'"\s*value:\s*\{\s*string_value:\s*"((?:[^"\\]|\\.)*)"', config_text)
    return json.loads(f'"{match.group(1)}"') if match else None


def engine_max_draft_len(model_dir: Path) -> int | None:
    """``max_draft_len`` of the engine a ``tensorrt_llm`` model serves: the reference engine's
    ``engine.json``, or a TensorRT-LLM engine's ``config.json`` (``build_config.max_draft_len``);
    None when it cannot be read (the target then decides)."""
    try:
        engine_dir = Path(_string_param((model_dir / "config.pbtxt").read_text(encoding="utf-8"), "gpt_model_path") or "")
        for name, keys in (("engine.json", ("max_draft_len",)), ("config.json", ("build_config", "max_draft_len"))):
            path = engine_dir / name
            if path.is_file():
                value = json.loads(path.read_text(encoding="utf-8"))
                for key in keys:
                    value = value.get(key, {}) if isinstance(value, dict) else {}
                return int(value) if isinstance(value, (int, float)) else None
    except (OSError, ValueError):
        return None
    return None


def _local_detokenizer(postprocessing_dir: Path):
    """Decode text here with postprocessing's own tokenizer and option, saving one model call
    per response; None (→ call the postprocessing model) when its config cannot be read."""
    try:
        text = (postprocessing_dir / "config.pbtxt").read_text(encoding="utf-8")
        tokenizer_dir = _string_param(text, "tokenizer_dir")
        skip = (_string_param(text, "skip_special_tokens") or "True").strip().lower() in ("true", "1", "yes")
        if not tokenizer_dir:
            return None
        from pipeline.triton_models.tokenizer import TextTokenizer

        tokenizer = TextTokenizer(tokenizer_dir)
    except Exception:  # noqa: BLE001 - fall back to the postprocessing model
        return None
    return lambda ids: tokenizer.decode(ids, skip)


def _rows(value: np.ndarray, batch: int) -> np.ndarray:
    """A client tensor as [batch, ...] (its first dimension is the batch)."""
    return value.reshape(batch, *value.shape[1:]) if value.ndim > 1 else value.reshape(batch, -1)


def check_client_inputs(request, batch: int) -> None:
    """The BLS's own input rules (upstream's ``Request.validate``) and TensorRT-LLM's ranges under
    the client names, every row, before any model runs (docs/request-validation.md)."""
    text = io.get(request, "text_input")
    if text is None or text.size == 0:
        raise BlsError("text_input is required")
    max_tokens = io.get(request, "max_tokens")
    if max_tokens is None or max_tokens.size == 0:
        raise BlsError(f"{MAX_TOKENS_RULE}: max_tokens is missing")
    if (max_tokens <= 0).any():
        raise BlsError(f"{MAX_TOKENS_RULE}, got {int(max_tokens.min())}")
    for row in range(batch):
        def get(name, row=row):
            value = io.get(request, name)
            return None if value is None or value.size == 0 else _rows(value, batch)[row].reshape(-1)[0].item()

        try:
            request_rules.check_ranges(get, use_client_names=True)
        except request_rules.RuleError as exc:
            raise BlsError(str(exc)) from None
        for name in ("num_draft_tokens", "draft_timeout_ms"):
            value = get(name)
            if value is not None and not value >= 0:
                raise BlsError(f"{name} must be >= 0, got {value}")


def wants_embedding_bias(pre_inputs: dict) -> bool:
    """Only a request with both bias inputs has a bias: without them the BLS neither asks
    preprocessing for EMBEDDING_BIAS nor sends ``embedding_bias`` on, whatever came back."""
    return "EMBEDDING_BIAS_WORDS" in pre_inputs and "EMBEDDING_BIAS_WEIGHTS" in pre_inputs


def embedding_bias(pre: dict, batch: int) -> np.ndarray | None:
    """``embedding_bias`` for the target, FP32 [batch, V] as its config declares; None (the input
    left out) when preprocessing sent none or an empty one. A bias that is not floating point is
    no bias preprocessing makes: an error here names it, rather than the target refusing it."""
    bias = pre.get("EMBEDDING_BIAS")
    if bias is None or bias.size == 0:
        return None
    if not np.issubdtype(bias.dtype, np.floating):
        raise BlsError(f"preprocessing returned EMBEDDING_BIAS as {bias.dtype} {list(bias.shape)}; "
                       "tensorrt_llm's embedding_bias is FP32 [batch, vocab]")
    return bias.reshape(batch, -1).astype(np.float32, copy=False)


class TritonPythonModel:
    def initialize(self, args):
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.accumulate = io.param_bool(config, "accumulate_tokens", False)
        self.target_name = io.param(config, "tensorrt_llm_model_name", "tensorrt_llm")
        self.draft_name = io.param(config, "tensorrt_llm_draft_model_name", "")
        self.ngram = ngram_settings(config)  # None: drafts come from the draft model
        repo = Path(args["model_repository"]).parent
        self.target_decoupled = _model_is_decoupled(repo / self.target_name)
        self.draft_decoupled = bool(self.draft_name) and _model_is_decoupled(repo / self.draft_name)
        self.target_max_draft_len = engine_max_draft_len(repo / self.target_name)
        self.counters = SpecDecodeCounters(args["model_name"], args["model_version"])
        self.latency = RequestLatency(args["model_name"], args["model_version"])
        self.detokenizer = _local_detokenizer(repo / "postprocessing")

    def execute(self, requests):
        # One request at a time per instance, in this thread: concurrent BLS exec() calls from
        # several threads of one stub crashed tritonserver 2.51 (SIGSEGV). Concurrency comes from
        # instances (render sets bls_instance_count; Triton hands each instance one request).
        for request in requests:
            sender = request.get_response_sender()
            try:
                inputs = io.snapshot(request)
            except io.RequestError as exc:
                self._send(sender, io.error_response(str(exc)), final=True)
                continue
            self._serve(inputs, sender)
        return None

    def finalize(self):
        pass

    # -- one request -----------------------------------------------------------------------------

    def _serve(self, request, sender) -> None:
        try:
            text = io.get(request, "text_input")
            batch = 1 if text is None else int(text.shape[0]) if text.ndim else 1
            check_client_inputs(request, batch)
            num_draft = int(io.scalar(request, "num_draft_tokens", 0) or 0)
            streaming = io.flag(request, "stream")
            if streaming and not self.decoupled:
                raise BlsError(STREAMING_NEEDS_DECOUPLED)
            if num_draft > 0:
                rounds = NgramDraftTarget if self.ngram is not None else DraftTarget
                rounds(self, request, sender, num_draft, streaming).run()
            else:
                self._forward(request, sender, streaming, batch)
        except (BlsError, SpecError, io.RequestError) as exc:
            self._send(sender, io.error_response(str(exc)), final=True)
        except Exception as exc:  # noqa: BLE001 - every request ends with a final response
            self._send(sender, io.error_response(f"{type(exc).__name__}: {exc}"), final=True)

    def preprocess(self, request, batch: int = 1) -> dict:
        inputs = {"QUERY": _rows(io.get(request, "text_input"), batch)[:, :1],
                  "REQUEST_OUTPUT_LEN": _rows(io.get(request, "max_tokens"), batch)[:, :1]}
        for client_name, step_name in (
            ("bad_words", "BAD_WORDS_DICT"), ("stop_words", "STOP_WORDS_DICT"), ("end_id", "END_ID"),
            ("pad_id", "PAD_ID"), ("embedding_bias_words", "EMBEDDING_BIAS_WORDS"),
            ("embedding_bias_weights", "EMBEDDING_BIAS_WEIGHTS"),
        ):
            value = io.get(request, client_name)
            if value is not None:
                inputs[step_name] = value.reshape(batch, -1)
        wanted = ["INPUT_ID", "REQUEST_INPUT_LEN", "BAD_WORDS_IDS", "STOP_WORDS_IDS", "OUT_END_ID",
                  "OUT_PAD_ID", "REQUEST_OUTPUT_LEN"]
        if wants_embedding_bias(inputs):
            wanted.append("EMBEDDING_BIAS")
        (response,) = self.call("preprocessing", inputs, wanted, decoupled=False)
        return response

    def llm_common(self, request, pre: dict, batch: int = 1) -> dict:
        """The target/draft inputs every call of this request shares: ids, word lists, sampling."""
        inputs = {
            "end_id": pre["OUT_END_ID"].reshape(batch, 1), "pad_id": pre["OUT_PAD_ID"].reshape(batch, 1),
            "stop_words_list": pre["STOP_WORDS_IDS"].reshape(batch, 2, -1),
            "bad_words_list": pre["BAD_WORDS_IDS"].reshape(batch, 2, -1),
        }
        bias = embedding_bias(pre, batch)
        if bias is not None:
            inputs["embedding_bias"] = bias
        for client_name, llm_name in SAMPLING_INPUTS.items():
            value = io.get(request, client_name)
            if value is not None:
                inputs[llm_name] = value.reshape(batch, 1)
        return inputs

    # -- non-speculative: forward to the target --------------------------------------------------

    def _forward(self, request, sender, streaming: bool, batch: int) -> None:
        """Upstream's non-speculative path: one target call; every target response becomes one
        BLS response (text delta when streaming, else the whole text; ``batch_index`` kept)."""
        if batch > 1 and not (self.decoupled and self.target_decoupled):
            raise BlsError(f"{BATCH_NEEDS_DECOUPLED} (and a decoupled tensorrt_llm_bls)")
        inputs = self._forward_inputs(request, streaming, batch)
        wanted = ["output_ids", "sequence_length"] + PASSTHROUGH_OUTPUTS
        accumulated: dict[int, list[int]] = {}
        sent_any = stopped = False
        one_response = not streaming and batch == 1
        # named, as upstream's BLS names its target calls (a fresh uuid), so that it can be stopped
        target_id = uuid.uuid4().hex
        for response in self.call_iter(self.target_name, inputs, wanted, self.target_decoupled, target_id):
            if not stopped and self.cancelled(sender):
                # the client is gone (gRPC cancel, HTTP disconnect): stop the target's request
                # in its engine, the way upstream's BLS stops one (a `stop` request under its
                # id), and drain what it still sends; nothing more goes to the client
                self.stop(self.target_name, target_id, self.target_decoupled)
                stopped = True
            if stopped or "output_ids" not in response:
                continue
            length = int(response["sequence_length"].reshape(-1)[0])
            ids = [int(t) for t in response["output_ids"].reshape(-1)[:length]]
            if streaming and self.accumulate:
                row = int(response["batch_index"].reshape(-1)[0]) if "batch_index" in response else 0
                ids = accumulated.setdefault(row, []) + ids
                accumulated[row] = ids
            extra = {k: v for k, v in response.items() if k in PASSTHROUGH_OUTPUTS}
            self.send_text(sender, ids, extra, final=one_response)
            sent_any = True
        if stopped:
            self._send_final_flag(sender)
            return
        if not sent_any and one_response:
            raise BlsError(f"{self.target_name} returned no output")
        if not one_response:
            self._send_final_flag(sender)

    def _forward_inputs(self, request, streaming: bool, batch: int) -> dict:
        pre = self.preprocess(request, batch)
        inputs = self.llm_common(request, pre, batch)
        inputs.update({
            "input_ids": pre["INPUT_ID"].reshape(batch, -1).astype(np.int32),
            "input_lengths": pre["REQUEST_INPUT_LEN"].reshape(batch, 1).astype(np.int32),
            "request_output_len": pre["REQUEST_OUTPUT_LEN"].reshape(batch, -1)[:, :1].astype(np.int32),
            "streaming": np.array([[streaming]] * batch, dtype=bool),
        })
        for client_name, llm_name in PASSTHROUGH_INPUTS.items():
            value = io.get(request, client_name)
            if value is not None:
                inputs[llm_name] = _rows(value, batch)
        return inputs

    # -- plumbing ------------------------------------------------------------------------------

    def text_tensor(self, ids: list[int]) -> np.ndarray:
        """``text_output`` as upstream's postprocessing makes it: 1-D, one string per (row × beam)."""
        if self.detokenizer is not None:
            return np.array([self.detokenizer(ids).encode("utf-8")], dtype=object)
        tokens = np.array(ids, dtype=np.int32).reshape(1, 1, len(ids))
        (post,) = self.call(
            "postprocessing",
            {"TOKENS_BATCH": tokens, "SEQUENCE_LENGTH": np.array([[len(ids)]], dtype=np.int32)},
            ["OUTPUT"], decoupled=False,
        )
        return post["OUTPUT"].reshape(-1)

    def send_text(self, sender, ids: list[int], extra: dict, final: bool) -> None:
        outputs = [io.tensor("text_output", self.text_tensor(ids))]
        outputs += [io.tensor(name, value) for name, value in extra.items()]
        self._send(sender, pb_utils.InferenceResponse(output_tensors=outputs), final=final)

    def call(self, model: str, inputs: dict, wanted: list[str], decoupled: bool) -> list[dict]:
        responses = list(self.call_iter(model, inputs, wanted, decoupled))
        data = [r for r in responses if r]
        if not data:
            raise BlsError(f"{model} returned no output")
        return data[-1:] if not decoupled else [self._merge_tokens(data)]

    @staticmethod
    def _merge_tokens(responses: list[dict]) -> dict:
        if len(responses) == 1:
            return responses[0]
        merged = dict(responses[-1])
        ids = [t for r in responses for t in r["output_ids"].reshape(-1)[: int(r["sequence_length"].reshape(-1)[0])]]
        merged["output_ids"] = np.array(ids, dtype=np.int32).reshape(1, 1, -1)
        merged["sequence_length"] = np.array([[len(ids)]], dtype=np.int32)
        return merged

    def call_iter(self, model: str, inputs: dict, wanted: list[str], decoupled: bool, request_id: str = ""):
        tensors = [pb_utils.Tensor(name, np.ascontiguousarray(value)) for name, value in inputs.items()]
        infer = pb_utils.InferenceRequest(model_name=model, requested_output_names=wanted, inputs=tensors,
                                          request_id=request_id)
        results = infer.exec(decoupled=True) if decoupled else [infer.exec()]
        for response in results:
            if response.has_error():
                raise BlsError(response.error().message())
            # copied: the arrays outlive ``response``, whose shared memory the stub may reuse
            yield {t.name(): np.array(t.as_numpy(), copy=True) for t in response.output_tensors()}

    def stop(self, model: str, request_id: str, decoupled: bool) -> None:
        """Stop ``model``'s request ``request_id`` (tensorrtllm_backend's `stop` input; the inputs
        upstream's BLS sends, lib/triton_decoder.py ``send_cancellation_request`` @r25.05). From
        this thread, between two responses of the call it stops, as upstream does."""
        inputs = {"input_ids": np.zeros([1, 1], dtype=np.int32), "input_lengths": np.zeros([1, 1], dtype=np.int32),
                  "request_output_len": np.zeros([1, 1], dtype=np.int32), "stop": np.array([[True]])}
        try:
            for _ in self.call_iter(model, inputs, [], decoupled, request_id):
                pass
        except Exception:  # noqa: BLE001 - the request may have ended meanwhile; the drain goes on either way
            pass

    @staticmethod
    def cancelled(sender) -> bool:
        try:
            return bool(sender.is_cancelled())
        except Exception:  # noqa: BLE001 - a failed step is reported to the client, the BLS keeps serving
            return False

    @staticmethod
    def _send(sender, response, final: bool) -> None:
        try:
            sender.send(response, flags=FINAL if final else 0)
        except Exception:  # noqa: BLE001 - the client went away
            pass

    @staticmethod
    def _send_final_flag(sender) -> None:
        try:
            sender.send(flags=FINAL)
        except Exception:  # noqa: BLE001 - a failed step is reported to the client, the BLS keeps serving
            pass
