"""Load-test datasets, one module per input format, each registered under the name
``loadtest.dataset_name`` / ``--dataset-name`` gives it (the way GuideLLM registers its
deserializers): our ``{id, category, prompt}`` JSONL, ShareGPT, OpenAI chat JSONL, a Hugging Face
dataset saved on disk, Spec-Bench and SPEED-Bench category files, and a Mooncake-style trace.

Reads the file (or directory) at ``dataset_path``; writes nothing and fetches nothing (docs/workload.md
says where each public set comes from). Every format yields the same rows
(:class:`~pipeline.loadtest.datasets.base.Row`): an id, a category (the data's own where it has one,
else the format's name), the prompt text, optionally a chat history (``messages``), the reference
answer (its token length is the dataset's own output length), lengths a trace gives, and a trace's
arrival time. Anything malformed is a :class:`DatasetError` naming file, line and field (exit 2).
"""

from __future__ import annotations

from pipeline.loadtest.datasets.base import (
    FORMATS,
    DatasetError,
    DatasetOptions,
    Row,
    dataset_format,
    load_rows,
    register,
)

# the format modules register themselves on import (FORMATS keeps this order)
# isort: off
from pipeline.loadtest.datasets import (  # noqa: F401 - imported to register the formats
    specdeploy_jsonl,
    sharegpt,
    openai_chat,
    hf_disk,
    spec_bench,
    mooncake,
)
# isort: on

__all__ = ["FORMATS", "DatasetError", "DatasetOptions", "Row", "dataset_format", "load_rows", "register"]
