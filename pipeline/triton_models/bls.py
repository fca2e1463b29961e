"""``tensorrt_llm_bls``: draft-target orchestration over ``tensorrt_llm_draft`` + ``tensorrt_llm``
(contract §6.1) and pass-through for non-speculative requests.

Speculative requests (``num_draft_tokens`` K > 0): preprocessing once, then per round the draft
proposes k = min(K, |P| + N − |C| − 1) tokens (``min_tokens`` = k) and the target verifies them
in one step (``draft_input_ids``, ``request_output_len`` = |d| + 1); the target's ``output_ids``
(prompt included) become the next context C. Stops on length, no progress (EOS), all drafts taken
without bonus, or a trailing stop word. Non-streaming: one response, ``text_output`` = decode(C),
prompt included unless excluded — as upstream. Our extension: with ``stream=true`` on a decoupled
BLS, the tokens accepted in each round are sent as one delta chunk; the last chunk carries the
final flag. Acceptance figures (perf outputs, ``specdeploy_spec_decode_*`` counters with model
label ``tensorrt_llm_bls``) cover the whole generation, not only the last round (documented
difference from upstream). Each instance serves one request at a time (concurrent BLS calls from
several threads of one stub crash tritonserver 2.51); concurrency comes from instances."""

from __future__ import annotations

import json
import sys
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from pipeline.triton_models import io
from pipeline.triton_models.llm import STREAMING_NEEDS_DECOUPLED, SWITCH_INTERVAL_S, parse_word_list
from pipeline.triton_models.metrics import SpecDecodeCounters

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
PERF_NAMES = [
    "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks",
    "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns",
    "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens",
]
PASSTHROUGH_OUTPUTS = PERF_NAMES + [
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


class BlsError(Exception):
    """A failed step; its text goes back to the client unchanged."""


def _as_row(array: np.ndarray) -> np.ndarray:
    return array.reshape(1, -1)


def _model_is_decoupled(model_dir: Path) -> bool:
    config = model_dir / "config.pbtxt"
    if not config.is_file():
        return False
    match = re.search(r"decoupled:\s*(\w+)", config.read_text(encoding="utf-8"))
    return bool(match) and match.group(1).lower() in ("true", "1")


def _string_param(config_text: str, key: str) -> str | None:
    match = re.search(r'key:\s*"' + re.escape(key) + r'"\s*value:\s*\{\s*string_value:\s*"((?:[^"\\]|\\.)*)"', config_text)
    return json.loads(f'"{match.group(1)}"') if match else None


def _local_detokenizer(postprocessing_dir: Path):
    """Decode text here with postprocessing's own tokenizer and option, saving one model call
    per response; None (→ call the postprocessing model) when its config cannot be read."""
    try:
        text = (postprocessing_dir / "config.pbtxt").read_text(encoding="utf-8")
        tokenizer_dir = _string_param(text, "tokenizer_dir")
        skip = (_string_param(text, "skip_special_tokens") or "True").strip().lower() in ("true", "1", "yes")
        if not tokenizer_dir:
            return None
        from pipeline.triton_models.tokenizer import TextTokenizer  # noqa: PLC0415

        tokenizer = TextTokenizer(tokenizer_dir)
    except Exception:  # noqa: BLE001 - fall back to the postprocessing model
        return None
    return lambda ids: tokenizer.decode(ids, skip)


@dataclass
class SpecTotals:
    draft_tokens: int = 0
    accepted_tokens: int = 0
    verify_steps: int = 0
    first_scheduled_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0
    last_perf: dict = field(default_factory=dict)

    def add_round(self, perf: dict, had_drafts: bool) -> None:
        if had_drafts:
            self.draft_tokens += int(perf.get("total_draft_tokens", 0))
            self.accepted_tokens += int(perf.get("total_accepted_draft_tokens", 0))
            self.verify_steps += 1
        self.first_scheduled_ns = self.first_scheduled_ns or int(perf.get("first_scheduled_time_ns", 0))
        self.first_token_ns = self.first_token_ns or int(perf.get("first_token_time_ns", 0))
        self.last_token_ns = int(perf.get("last_token_time_ns", 0)) or self.last_token_ns
        self.last_perf = perf


class TritonPythonModel:
    def initialize(self, args):
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.accumulate = io.param_bool(config, "accumulate_tokens", False)
        self.target_name = io.param(config, "tensorrt_llm_model_name", "tensorrt_llm")
        self.draft_name = io.param(config, "tensorrt_llm_draft_model_name", "")
        repo = Path(args["model_repository"]).parent
        self.target_decoupled = _model_is_decoupled(repo / self.target_name)
        self.draft_decoupled = bool(self.draft_name) and _model_is_decoupled(repo / self.draft_name)
        self.counters = SpecDecodeCounters(args["model_name"], args["model_version"])
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
            num_draft = int(io.scalar(request, "num_draft_tokens", 0) or 0)
            streaming = io.flag(request, "stream")
            if streaming and not self.decoupled:
                raise BlsError(STREAMING_NEEDS_DECOUPLED)
            if num_draft > 0:
                self._speculative(request, sender, num_draft, streaming)
            else:
                self._forward(request, sender, streaming)
        except (BlsError, io.RequestError) as exc:
            self._send(sender, io.error_response(str(exc)), final=True)
        except Exception as exc:  # noqa: BLE001 - every request ends with a final response
            self._send(sender, io.error_response(f"{type(exc).__name__}: {exc}"), final=True)

    def _preprocess(self, request) -> dict:
        text = io.get(request, "text_input")
        if text is None:
            raise BlsError("text_input is required")
        inputs = {"QUERY": text.reshape(-1, 1)[:1], "REQUEST_OUTPUT_LEN": io.get(request, "max_tokens").reshape(-1, 1)[:1]}
        for client_name, step_name in (
            ("bad_words", "BAD_WORDS_DICT"), ("stop_words", "STOP_WORDS_DICT"), ("end_id", "END_ID"),
            ("pad_id", "PAD_ID"), ("embedding_bias_words", "EMBEDDING_BIAS_WORDS"),
            ("embedding_bias_weights", "EMBEDDING_BIAS_WEIGHTS"),
        ):
            value = io.get(request, client_name)
            if value is not None:
                inputs[step_name] = _as_row(value)
        wanted = ["INPUT_ID", "REQUEST_INPUT_LEN", "BAD_WORDS_IDS", "STOP_WORDS_IDS", "OUT_END_ID",
                  "OUT_PAD_ID", "EMBEDDING_BIAS", "REQUEST_OUTPUT_LEN"]
        (response,) = self._call("preprocessing", inputs, wanted, decoupled=False)
        return response

    def _llm_common(self, request, pre: dict) -> dict:
        inputs = {
            "end_id": pre["OUT_END_ID"].reshape(1, 1), "pad_id": pre["OUT_PAD_ID"].reshape(1, 1),
            "stop_words_list": pre["STOP_WORDS_IDS"].reshape(1, 2, -1),
            "bad_words_list": pre["BAD_WORDS_IDS"].reshape(1, 2, -1),
        }
        if pre["EMBEDDING_BIAS"].size:
            inputs["embedding_bias"] = pre["EMBEDDING_BIAS"].reshape(1, -1)
        for client_name, llm_name in SAMPLING_INPUTS.items():
            value = io.get(request, client_name)
            if value is not None:
                inputs[llm_name] = value.reshape(1, 1)
        return inputs

    # -- non-speculative: forward to the target --------------------------------------------------

    def _forward(self, request, sender, streaming: bool) -> None:
        batch = io.get(request, "text_input").reshape(-1).shape[0]
        if batch > 1:
            raise BlsError("batch size > 1 is not supported by this BLS; send one prompt per request")
        pre = self._preprocess(request)
        prompt = [int(t) for t in pre["INPUT_ID"].reshape(-1)[: int(pre["REQUEST_INPUT_LEN"].reshape(-1)[0])]]
        inputs = self._llm_common(request, pre)
        inputs.update({
            "input_ids": np.array([prompt], dtype=np.int32),
            "input_lengths": np.array([[len(prompt)]], dtype=np.int32),
            "request_output_len": pre["REQUEST_OUTPUT_LEN"].reshape(1, 1).astype(np.int32),
            "streaming": np.array([[streaming]], dtype=bool),
        })
        for client_name, llm_name in PASSTHROUGH_INPUTS.items():
            value = io.get(request, client_name)
            if value is not None:
                inputs[llm_name] = value.reshape(1, *value.shape[1:]) if value.ndim > 1 else value.reshape(1, -1)
        wanted = ["output_ids", "sequence_length"] + PASSTHROUGH_OUTPUTS
        accumulated: list[int] = []
        sent_any = False
        for response in self._call_iter(self.target_name, inputs, wanted, self.target_decoupled):
            if "output_ids" not in response:
                continue
            length = int(response["sequence_length"].reshape(-1)[0])
            ids = [int(t) for t in response["output_ids"].reshape(-1)[:length]]
            if streaming and self.accumulate:
                accumulated.extend(ids)
                ids = accumulated
            extra = {k: v for k, v in response.items() if k in PASSTHROUGH_OUTPUTS}
            self._send(sender, self._text_response(ids, extra), final=not streaming)
            sent_any = True
        if streaming or not sent_any:
            if not sent_any and not streaming:
                raise BlsError(f"{self.target_name} returned no output")
            self._send_final_flag(sender)

    # -- speculative: draft-target rounds ----------------------------------------------------------

    def _speculative(self, request, sender, num_draft: int, streaming: bool) -> None:
        if not self.draft_name:
            raise BlsError("cannot perform speculative decoding without draft model")
        if io.get(request, "text_input").reshape(-1).shape[0] > 1:
            raise BlsError("speculative decoding is not supported with batch size > 1")
        if io.flag(request, "return_context_logits"):
            raise BlsError("context logits are not supported with speculative decoding")
        arrival_ns = time.monotonic_ns()
        pre = self._preprocess(request)
        prompt = [int(t) for t in pre["INPUT_ID"].reshape(-1)[: int(pre["REQUEST_INPUT_LEN"].reshape(-1)[0])]]
        max_new = int(pre["REQUEST_OUTPUT_LEN"].reshape(-1)[0])
        stop_words = parse_word_list(pre["STOP_WORDS_IDS"].reshape(1, 2, -1))
        common = self._llm_common(request, pre)
        use_draft_logits = io.flag(request, "use_draft_logits")
        exclude = io.flag(request, "exclude_input_in_output")
        perf_wanted = io.flag(request, "return_perf_metrics")
        count_in, count_out = io.flag(request, "return_num_input_tokens"), io.flag(request, "return_num_output_tokens")
        totals = SpecTotals()
        context = list(prompt)
        limit = len(prompt) + max_new
        while True:
            k = min(num_draft, limit - len(context) - 1)
            drafts, draft_logits = self._propose(common, context, k, use_draft_logits) if k > 0 else ([], None)
            previous = context
            context, perf = self._verify(common, context, drafts, draft_logits)
            totals.add_round(perf, had_drafts=bool(drafts))
            done = (
                len(context) >= limit
                or (drafts and context == previous + drafts)
                or context == previous
                or any(w and context[-len(w):] == w for w in stop_words)
                or self._cancelled(sender)
            )
            if streaming:
                delta = context[len(previous):]
                extra = self._spec_extras(totals, arrival_ns, perf_wanted, len(prompt), len(delta), count_in, count_out)
                self._send(sender, self._text_response(delta, extra), final=done)
            if done:
                break
        self.counters.add(totals.draft_tokens, totals.accepted_tokens, totals.verify_steps)
        if not streaming:
            ids = context[len(prompt):] if exclude else context
            extra = self._spec_extras(totals, arrival_ns, perf_wanted, len(prompt), len(context) - len(prompt), count_in, count_out)
            self._send(sender, self._text_response(ids, extra), final=True)

    def _propose(self, common: dict, context: list[int], k: int, use_draft_logits: bool):
        inputs = dict(common)
        inputs.update({
            "input_ids": np.array([context], dtype=np.int32),
            "input_lengths": np.array([[len(context)]], dtype=np.int32),
            "request_output_len": np.array([[k]], dtype=np.int32),
            "min_tokens": np.array([[k]], dtype=np.int32),
            "streaming": np.array([[False]]), "exclude_input_in_output": np.array([[False]]),
        })
        if use_draft_logits:
            inputs["return_generation_logits"] = np.array([[True]])
        wanted = ["output_ids", "sequence_length"] + (["generation_logits"] if use_draft_logits else [])
        (out,) = self._call(self.draft_name, inputs, wanted, self.draft_decoupled)
        length = int(out["sequence_length"].reshape(-1)[0])
        drafts = [int(t) for t in out["output_ids"].reshape(-1)[len(context):length]]
        logits = None
        if use_draft_logits and drafts and "generation_logits" in out:
            gen = out["generation_logits"]
            logits = gen.reshape(-1, gen.shape[-1])[-len(drafts):]
        return drafts, logits

    def _verify(self, common: dict, context: list[int], drafts: list[int], draft_logits):
        inputs = dict(common)
        inputs.update({
            "input_ids": np.array([context], dtype=np.int32),
            "input_lengths": np.array([[len(context)]], dtype=np.int32),
            "request_output_len": np.array([[len(drafts) + 1]], dtype=np.int32),
            "streaming": np.array([[False]]), "exclude_input_in_output": np.array([[False]]),
            "return_perf_metrics": np.array([[True]]),
        })
        if drafts:
            inputs["draft_input_ids"] = np.array([drafts], dtype=np.int32)
        if draft_logits is not None:
            inputs["draft_logits"] = draft_logits.reshape(1, *draft_logits.shape)
        (out,) = self._call(self.target_name, inputs, ["output_ids", "sequence_length"] + PERF_NAMES, self.target_decoupled)
        length = int(out["sequence_length"].reshape(-1)[0])
        perf = {name: out[name].reshape(-1)[0].item() for name in PERF_NAMES if name in out}
        return [int(t) for t in out["output_ids"].reshape(-1)[:length]], perf

    def _spec_extras(self, totals: SpecTotals, arrival_ns: int, perf: bool, n_in: int, n_out: int, count_in: bool, count_out: bool) -> dict:
        extra = {}
        if perf:
            last = totals.last_perf
            values = {
                "kv_cache_alloc_new_blocks": (last.get("kv_cache_alloc_new_blocks", 0), np.int32),
                "kv_cache_reused_blocks": (last.get("kv_cache_reused_blocks", 0), np.int32),
                "kv_cache_alloc_total_blocks": (last.get("kv_cache_alloc_total_blocks", 0), np.int32),
                "arrival_time_ns": (arrival_ns, np.int64),
                "first_scheduled_time_ns": (totals.first_scheduled_ns, np.int64),
                "first_token_time_ns": (totals.first_token_ns, np.int64),
                "last_token_time_ns": (totals.last_token_ns, np.int64),
                "acceptance_rate": (totals.accepted_tokens / totals.draft_tokens if totals.draft_tokens else 0.0, np.float32),
                "total_accepted_draft_tokens": (totals.accepted_tokens, np.int32),
                "total_draft_tokens": (totals.draft_tokens, np.int32),
            }
            extra.update({k: np.array([[v]], dtype=t) for k, (v, t) in values.items()})
        if count_in:
            extra["num_input_tokens"] = np.array([[n_in]], dtype=np.int32)
        if count_out:
            extra["num_output_tokens"] = np.array([[n_out]], dtype=np.int32)
        return extra

    @staticmethod
    def _cancelled(sender) -> bool:
        try:
            return bool(sender.is_cancelled())
        except Exception:  # noqa: BLE001
            return False

    # -- plumbing ------------------------------------------------------------------------------

    def _text_response(self, ids: list[int], extra: dict):
        if self.detokenizer is not None:
            text = np.array([[self.detokenizer(ids).encode("utf-8")]], dtype=object)
            outputs = [io.tensor("text_output", text)] + [io.tensor(name, value) for name, value in extra.items()]
            return pb_utils.InferenceResponse(output_tensors=outputs)
        tokens = np.array(ids, dtype=np.int32).reshape(1, 1, len(ids))
        (post,) = self._call(
            "postprocessing",
            {"TOKENS_BATCH": tokens, "SEQUENCE_LENGTH": np.array([[len(ids)]], dtype=np.int32)},
            ["OUTPUT"], decoupled=False,
        )
        outputs = [io.tensor("text_output", post["OUTPUT"].reshape(1, -1))]
        outputs += [io.tensor(name, value) for name, value in extra.items()]
        return pb_utils.InferenceResponse(output_tensors=outputs)

    def _call(self, model: str, inputs: dict, wanted: list[str], decoupled: bool) -> list[dict]:
        responses = list(self._call_iter(model, inputs, wanted, decoupled))
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

    def _call_iter(self, model: str, inputs: dict, wanted: list[str], decoupled: bool):
        tensors = [pb_utils.Tensor(name, np.ascontiguousarray(value)) for name, value in inputs.items()]
        infer = pb_utils.InferenceRequest(model_name=model, requested_output_names=wanted, inputs=tensors)
        results = infer.exec(decoupled=True) if decoupled else [infer.exec()]
        for response in results:
            if response.has_error():
                raise BlsError(response.error().message())
            yield {t.name(): t.as_numpy() for t in response.output_tensors()}

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
        except Exception:  # noqa: BLE001
            pass
