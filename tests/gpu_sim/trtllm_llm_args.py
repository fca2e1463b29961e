"""Stand-in for ``tensorrt_llm.llmapi.llm_args`` of TensorRT-LLM 1.2.x (GPU-host simulation).

:func:`container.make_container` copies this file into the fake image's ``tensorrt_llm/llmapi/``
so the live preflight (``pipeline.validate.live.llmapi``) loads ``model.yaml`` into it as into the
real package. What it keeps of upstream's classes (``tensorrt_llm/llmapi/llm_args.py``, the 1.2
copy ``pipeline/trtllm/llmapi_facts.yaml`` cites): pydantic models that refuse unknown keys
(``extra="forbid"`` on upstream's ``StrictBaseModel``), ``DecodingBaseConfig.from_dict`` choosing the
class by ``decoding_type``, ``speculative_model`` accepting the ``speculative_model_dir`` alias, the
field names and bounds below. Written from those facts, not copied; the real classes have many more
fields, which only make a real install accept more. ``draft_len_schedule`` keeps the validator of
the read copy (a build after PR #10860 reads the keys differently; pipeline/trtllm/schedule_forms.py). ``GPU_SIM_LLM_ARGS_BUILD=pre-rename`` stands for
a 1.2 build before the rename: the draft is ``speculative_model_dir``, without the new name (a
deliberately different install).
"""

from __future__ import annotations

import os
from typing import Literal, Optional

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, field_validator

PRE_RENAME = os.environ.get("GPU_SIM_LLM_ARGS_BUILD") == "pre-rename"


class StrictBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DecodingBaseConfig(StrictBaseModel):
    max_draft_len: Optional[NonNegativeInt] = None
    max_total_draft_tokens: Optional[int] = None
    if PRE_RENAME:
        speculative_model_dir: Optional[str] = None
    else:
        speculative_model: Optional[str] = Field(default=None, validation_alias=AliasChoices("speculative_model",
                                                                                            "speculative_model_dir"))
    max_concurrency: Optional[NonNegativeInt] = None
    draft_len_schedule: Optional[dict[int, int]] = None
    load_format: Optional[str] = None

    @field_validator("draft_len_schedule")
    @classmethod
    def _schedule(cls, v, info):
        """The read copy's ``validate_draft_len_schedule_and_sort``: keys >= 1, values >= 0, key 1
        present, ``schedule[1] == max_draft_len`` and every value <= it; sorted by key."""
        if v is None:
            return v
        if any(bs < 1 for bs in v) or any(k < 0 for k in v.values()):
            raise ValueError("draft_len_schedule: batch sizes >= 1 and draft lengths >= 0")
        if 1 not in v:
            raise ValueError("draft_len_schedule must include batch_size=1")
        top = info.data.get("max_draft_len")
        if top is not None and (v[1] != top or any(k > top for k in v.values())):
            raise ValueError("draft_len_schedule[1] must equal max_draft_len and no draft length exceed it")
        return dict(sorted(v.items()))

    @classmethod
    def from_dict(cls, data: dict):
        classes = {"Eagle3": Eagle3DecodingConfig, "Draft_Target": DraftTargetDecodingConfig,
                   "NGram": NGramDecodingConfig, "MTP": MTPDecodingConfig}
        kind = data.pop("decoding_type", None)
        if kind not in classes:
            raise ValueError(f"Invalid decoding type: {kind}")
        return classes[kind](**data)


class DraftTargetDecodingConfig(DecodingBaseConfig):
    pass


class NGramDecodingConfig(DecodingBaseConfig):
    max_matching_ngram_size: PositiveInt = 2
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True


class Eagle3DecodingConfig(DecodingBaseConfig):
    eagle_choices: Optional[list[list[int]]] = None
    num_eagle_layers: Optional[int] = None
    eagle3_one_model: Optional[bool] = True
    eagle3_layers_to_capture: Optional[set[int]] = None
    eagle3_model_arch: Literal["llama3", "mistral_large3"] = "llama3"


class MTPDecodingConfig(DecodingBaseConfig):
    num_nextn_predict_layers: PositiveInt = 1


class KvCacheConfig(StrictBaseModel):
    enable_block_reuse: bool = True
    max_tokens: Optional[int] = None
    free_gpu_memory_fraction: Optional[float] = Field(default=0.9, ge=0, le=1)
    dtype: str = "auto"
    tokens_per_block: int = 32


class CudaGraphConfig(StrictBaseModel):
    batch_sizes: Optional[list[int]] = None
    max_batch_size: NonNegativeInt = 0
    enable_padding: bool = False


class TorchLlmArgs(StrictBaseModel):
    model: str
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    trust_remote_code: bool = False
    max_batch_size: Optional[int] = 2048
    max_num_tokens: Optional[int] = 8192
    max_seq_len: Optional[int] = None
    max_beam_width: Optional[int] = 1
    enable_chunked_prefill: bool = False
    disable_overlap_scheduler: bool = False
    return_perf_metrics: bool = False
    enable_iter_perf_stats: bool = False
    kv_cache_config: KvCacheConfig = Field(default_factory=KvCacheConfig)
    cuda_graph_config: Optional[CudaGraphConfig] = None
    speculative_config: Optional[DecodingBaseConfig] = None
