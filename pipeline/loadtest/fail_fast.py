"""Stopping a load test that cannot succeed, with the server's own words and a likely fix.

Reads the ``raw/parts/<key>.<pid>.abort.json`` markers a Locust process writes when the requests
of its first seconds fail past ``loadtest.fail_fast_error_rate`` (``locustfiles/locustfile.py``,
``_Run.watch_failures``). Writes nothing: the runner records what :func:`read_abort` returns in
``runs.json`` (``stopped_early``) and ``run.json``, then raises :class:`LoadTestStopped`, whose
exit code is :data:`pipeline.errors.EXIT_STOPPED_EARLY` (4), none of the verdicts' nor a failure's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pipeline.errors import EXIT_STOPPED_EARLY, SpecdeployError

# (test on the lowered error text and the HTTP status, the likely fix); the first that matches wins
_FIXES: list[tuple[Any, str]] = [
    (lambda text, status: status in (400, 422) and re.search(r"unexpected|extra (fields|inputs)|not permitted|"
                                                            r"unrecognized|unknown field", text) is not None,
     "the server refuses a field of the request: if it names top_k, set loadtest.openai_top_k: false (or send "
     "temperature 0 for greedy); other fields come from extra_inputs. Which servers take which fields: "
     "docs/openai-endpoints.md"),
    (lambda text, status: "pinned to" in text or ("model" in text and (status == 404 or re.search(
        r"not found|does not exist|unknown model|not served|no model", text) is not None)),
     "wrong model name: pass the name the server lists at GET /v1/models (--model, or --model-baseline / "
     "--model-speculative when the two servers name it differently)"),
    (lambda text, status: status in (404, 405),
     "wrong path: give the server's base URL (http://host:port, without /v1/...) and check loadtest.openai_api "
     "(completions or chat) is an API the server offers"),
    (lambda text, status: status in (401, 403), "the server wants credentials this load tester does not send"),
    (lambda text, status: "chat template" in text or "chat_template" in text,
     "the model has no chat template: use loadtest.openai_api: completions"),
    (lambda text, status: re.search(r"connection refused|errno 111|name or service not known|"
                                    r"cannot assign requested address|connectionreseterror|"
                                    r"remote end closed|timed out|timeout", text) is not None,
     "the server is not up (or not listening) at the endpoint: start it, wait until it is ready, check host:port"),
    (lambda text, status: status is not None and status >= 500,
     "the server failed on the request: its log says why"),
]


class LoadTestStopped(SpecdeployError):
    """The load test stopped before its sweep: requests failed from the start."""

    exit_code = EXIT_STOPPED_EARLY

    def __init__(self, arm: str, key: str, abort: dict[str, Any], run_dir: Path):
        self.arm, self.key, self.abort, self.run_dir = arm, key, abort, run_dir
        super().__init__(f"load test stopped early: {abort['errors']} of the first {abort['finished']} "
                         f"requests of run {key} ({arm}) failed")

    def lines(self) -> list[str]:
        first = self.abort.get("first_error") or {}
        status = first.get("http_status")
        return [str(self),
                f"  first error{f' (HTTP {status})' if status else ''}, verbatim:",
                *[f"    {line}" for line in str(first.get("error") or first.get("status")).splitlines()[:20]],
                f"  likely fix: {self.abort.get('likely_fix')}",
                f"  what was measured is in {self.run_dir} (runs.json, raw/); no report was made"]


def likely_fix(error: str | None, http_status: int | None) -> str:
    text = (error or "").lower()
    for test, fix in _FIXES:
        if test(text, http_status):
            return fix
    return "read the server's message above"


def read_abort(run_dir: Path, key: str) -> dict[str, Any] | None:
    """The earliest abort marker of run ``key`` (one per Locust process that stopped), with its
    likely fix; None when the run was not stopped."""
    aborts = []
    for path in sorted((run_dir / "raw" / "parts").glob(f"{key}.*.abort.json")):
        try:
            aborts.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    if not aborts:
        return None
    abort = min(aborts, key=lambda a: a.get("t_abort") or 0)
    first = abort.get("first_error") or {}
    return {**abort, "processes_stopped": len(aborts),
            "likely_fix": likely_fix(first.get("error"), first.get("http_status"))}
