"""The first errors of a ``tritonserver`` log: what a failed start shows before the log's tail.

Reads a server log's text; writes nothing. When a model fails to load, Triton logs the cause
once per failed model (``model_lifecycle.cc``: ``failed to load 'NAME' version N: CAUSE``) early
in the log, then prints its model and option tables and shuts down: the last 40 lines say
"failed to load all models" and the cause is further up. :func:`first_errors` picks, in the
order they appear: each model's load failure (the cause's first line), the exception line of a
Python traceback a stub printed, a C++ abort of a stub (``terminate called …`` / ``what():``),
and any other error-severity line that is not one of the CPU host's expected complaints about
CUDA, NVML and DCGM.
"""

from __future__ import annotations

import re

# glog's prefix, as tritonserver writes it: severity, MMDD, time, thread, file:line]
_GLOG = re.compile(r"^(?P<severity>[IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ (?P<source>[^\]]+)\] (?P<message>.*)$")
_LOAD_FAILED = re.compile(r"failed to load '(?P<model>[^']+)' version \d+: (?P<cause>.*)")
_STUB_FAILED = re.compile(r"Failed to initialize Python stub(?: for model (?P<model>\S+))?: (?P<cause>.*)")
# What a CPU-only host always logs at error severity (no CUDA driver, no GPU for the ensemble's
# stream, no DCGM): noise for every start, never the cause of a failed one.
_CPU_HOST_NOISE = ("CudaDriverHelper has not been initialized", "CUDA driver version is insufficient",
                   "Failed to initialize NVML", "DCGM", "Unable to get CUDA device count")
_MAX_CHARS = 600


def _unquote(message: str) -> str:
    """glog's quoted message (``"text\\n\\nAt: …"``) as its first line of text."""
    message = message.strip()
    if len(message) >= 2 and message[0] == message[-1] == '"':
        message = message[1:-1]
    return message.split("\\n", 1)[0].strip()


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_CHARS else text[: _MAX_CHARS - 1] + "…"


def _cause(text: str) -> str:
    """An error's cause without the wrappers Triton puts around the same text at each layer."""
    return re.sub(r"^(?:ERROR: Failed to create instance: |Internal: |Python stub failed: )+", "", text)


def first_errors(text: str, limit: int = 5) -> list[str]:
    """Up to ``limit`` distinct error lines of a tritonserver log, first first (see the module).
    One cause logged at several layers (the stub, the instance, the model's load) is shown once,
    named by the model whose load it failed."""
    found: list[tuple[str, str]] = []  # (line shown, its cause)
    lines = text.splitlines()

    def add(shown: str, cause: str | None = None, model: str | None = None) -> None:
        cause = _cause(cause if cause is not None else shown)
        for i, (_, seen) in enumerate(found):
            if seen == cause:
                if model:  # the same cause, now with the model it failed: name it there
                    found[i] = (_clip(shown), cause)
                return
        found.append((_clip(shown), cause))

    for i, line in enumerate(lines):
        match = _GLOG.match(line)
        if match:
            message = match.group("message")
            failed = _LOAD_FAILED.search(message)
            stub = _STUB_FAILED.search(message)
            if failed:
                cause = _unquote(failed.group("cause"))
                add(f"{failed.group('model')}: failed to load: {_cause(cause)}", cause, failed.group("model"))
            elif stub:
                add(f"Python stub failed: {_unquote(stub.group('cause'))}", _unquote(stub.group("cause")))
            elif (match.group("severity") in "EF" and not any(n in message for n in _CPU_HOST_NOISE)
                  and "failed to load" not in message and "depends on" not in message):  # consequences, not causes
                add(_unquote(message))
            continue
        if line.startswith("Traceback (most recent call last):"):
            for later in lines[i + 1:]:
                if later and not later.startswith((" ", "\t")):
                    add(f"Python traceback: {later.strip()}", later.strip())
                    break
        elif line.startswith("terminate called after throwing"):
            what = next((w.strip() for w in lines[i + 1:i + 3] if w.strip().startswith("what():")), "")
            add(f"a stub aborted: {line.strip()}" + (f" ({what})" if what else ""))
    return [shown for shown, _ in found[:limit]]


def failure_report(text: str, tail_lines: int = 40) -> str:
    """The first errors (when there are any), then ``last lines:`` and the last ``tail_lines`` lines."""
    tail = "\n".join(text.splitlines()[-tail_lines:])
    errors = first_errors(text)
    head = "first errors in the log:\n" + "".join(f"  {e}\n" for e in errors) if errors else ""
    return f"{head}last lines:\n{tail}"
