"""The raw per-request record, one JSON line per request in ``RUN_DIR/raw/<key>.jsonl``: written by
the Locust users (``locustfiles/lt_common.build_record``, a plain dict on the hot path, typed here as
:class:`RawRecordDict`), read by ``pipeline.report.stats`` (every statistic comes from these records).
:class:`RawRecord` is the same record as a model, for its JSON schema and for checking a file."""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from pipeline.artefacts.base import Artefact

RECORD_SCHEMA = "specdeploy-raw/1"


class RawRecord(Artefact):
    """One request as the client saw it: when it was scheduled and sent, each chunk's time and
    token count, the output, the server's acceptance counters and the status."""

    SCHEMA = RECORD_SCHEMA
    VERSION = 1
    FILE = "RUN_DIR/raw/<key>.jsonl (one per line)"
    WRITER = "specdeploy loadtest"

    run_id: str
    arm: str
    repeat: int
    concurrency: int | None
    target_rate: float | None
    mode: str
    transport: str
    draft_len: int | None
    stage: Literal["warmup", "measure"]
    request_id: str
    prompt_id: str | None
    category: str | None
    prompt_index: int | None
    worker_pid: int
    t_scheduled: int | None
    t_sent: int | None
    t_first_token: int | None
    t_last: int | None
    chunk_times: list[int]
    tokens_per_chunk: list[int]
    n_chunks: int
    empty_chunks: int
    osl: int
    osl_source: Literal["server", "retokenized", "chunks"]
    osl_retok: int | None
    isl_chars: int
    # prompt tokens, counted by the load test's tokenizer (None without one); the report's forecast
    # takes its context from these and ``osl``
    isl: int | None = None
    prompt_echoed: bool
    hit_max_tokens: bool
    output_text: str
    output_sha256: str
    draft_tokens: int | None
    accepted_tokens: int | None
    acceptance_rate: float | None
    draft_fallbacks: int | None
    server_times_ns: dict[str, int | float]
    status: str
    error: str | None
    # reasoning models (transport openai): the first answer token after the reasoning, and the reasoning text
    t_first_answer: int | None = None
    reasoning_text: str | None = None
    http_status: int | None = None  # the server's HTTP status when it refused the request

# the hot-path form: the same keys, no validation (``schema`` is a keyword-free TypedDict key)
RawRecordDict = TypedDict("RawRecordDict", {
    "schema": str, "schema_version": int,
    # ruff reads the functional TypedDict's values as annotations; these are field names
    **{name: Any for name in RawRecord.model_fields if name not in ("schema_name", "schema_version")},  # noqa: F821 - the functional TypedDict's values are field names, not annotations
})
