"""The raw per-request record, one JSON line per request in ``RUN_DIR/raw/<key>.jsonl``: written by
the Locust users (``locustfiles/lt_common.build_record``), read by ``pipeline.report.stats`` (every
statistic comes from these records).

One definition, :class:`RawRecordFields` (a standard-library dataclass): the Locust side fills one
per request and writes :meth:`RawRecordFields.as_record`, so a missing or unknown field is a
``TypeError`` where the record is built; :class:`RawRecord`, the pydantic model of the same record
(its JSON schema, ``specdeploy schema record``, checking a file), is generated from the dataclass.
The model is made on first use (a module ``__getattr__``), so importing this module costs no
pydantic: the Locust processes import it on their start-up path (measured: pydantic and the
artefact base add 0.25-0.45 s to a Locust process's ~1.5 s of imports on the 2-core CI host)."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Literal

RECORD_SCHEMA = "specdeploy-raw/1"
RECORD_VERSION = 1


@dataclass(kw_only=True)
class RawRecordFields:
    """One request as the client saw it: when it was scheduled and sent, each chunk's time and
    token count, the output, the server's acceptance counters and the status.

    Times are ``perf_counter_ns`` values of the writing process, relative to its run's start. A field with a
    default is one that files written before it existed lack (keyword-only, so the fields keep the
    order of the written line)."""

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
    ramp_step: int | None = None  # loadtest.ramp: the step (level) the request was sent in
    t_sent: int | None
    t_first_token: int | None
    # reasoning models (transport openai): the first answer token after the reasoning
    t_first_answer: int | None = None
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
    max_tokens: int | None = None  # this request's max_tokens (drawn output lengths differ per request)
    output_text: str
    reasoning_text: str | None = None  # reasoning models: the reasoning text
    output_sha256: str
    draft_tokens: int | None
    accepted_tokens: int | None
    acceptance_rate: float | None
    draft_fallbacks: int | None
    server_times_ns: dict[str, int | float]
    status: str
    error: str | None
    http_status: int | None = None  # the server's HTTP status when it refused the request

    def as_record(self) -> dict[str, Any]:
        """The JSON line's object: the schema tag, then the fields in their order (a shallow view:
        no copy of the chunk lists on the Locust hot path)."""
        return {"schema": RECORD_SCHEMA, "schema_version": RECORD_VERSION, **vars(self)}


def _make_model() -> type:
    """:class:`RawRecord`: the pydantic model of :class:`RawRecordFields`, field for field."""

    from pydantic import create_model  # noqa: PLC0415 - start-up: pydantic (the Locust processes import this module through lt_common)

    from pipeline.artefacts.base import Artefact  # noqa: PLC0415 - start-up: pydantic (pipeline.artefacts.base; the Locust processes import this module)

    class _RawRecordBase(Artefact):
        SCHEMA = RECORD_SCHEMA
        VERSION = RECORD_VERSION
        FILE = "RUN_DIR/raw/<key>.jsonl (one per line)"
        WRITER = "specdeploy loadtest"

    hints = typing.get_type_hints(RawRecordFields)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(RawRecordFields):
        fields[f.name] = (hints[f.name], ... if f.default is dataclasses.MISSING else f.default)
    return create_model("RawRecord", __base__=_RawRecordBase, __module__=__name__,
                        __doc__=RawRecordFields.__doc__, **fields)


def __getattr__(name: str) -> Any:
    """``RawRecord`` on first use (PEP 562), then kept as a module attribute."""
    if name == "RawRecord":
        model = _make_model()
        globals()["RawRecord"] = model
        return model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
