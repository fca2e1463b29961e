"""Reach: the headers, API key and extra body fields every request of a load test carries
(``loadtest.headers``, ``loadtest.api_key_env``, ``loadtest.extra_body``; ``--header``,
``--api-key-env``, ``--extra-body``).

The API key is read from the environment by whoever sends a request: the Locust process (from the
variable's *name*, which is all its settings file holds) and this process for its own probes
(``GET /v1/models``). It is never written to a file: not the settings, run.json, the report, a log.
Reads the environment; writes nothing.
"""

from __future__ import annotations

import os

from pipeline.errors import EXIT_USAGE, SpecdeployError

DEFAULT_OPENAI_KEY_ENV = "OPENAI_API_KEY"  # what the OpenAI clients (and vLLM's `bench serve`) read
HEADERS_ENV = "SPECDEPLOY_LOADTEST_HEADERS"  # locustfiles/lt_common.py reads the header values from here
REDACTED = "<redacted: given to the load generator in its environment>"


def redacted(config: dict) -> dict:
    """A config dump with the header values replaced: vLLM's `bench serve` treats --header as sensitive
    (an auth scheme of its own may travel there), so their values stay out of run.json and the settings
    files, as the API key does; the names stay, to say what was sent."""
    lt = config.get("loadtest") or {}
    if not lt.get("headers"):
        return config
    return {**config, "loadtest": {**lt, "headers": {name: REDACTED for name in lt["headers"]}}}


class ApiKeyError(SpecdeployError):
    """The named API-key variable is unset, or an endpoint refused the request for want of a key."""

    exit_code = EXIT_USAGE


def api_key_env(lt, environ: dict[str, str] | None = None) -> str | None:
    """The variable the key comes from: ``api_key_env`` as configured (it must be set), else, for an
    OpenAI endpoint, OPENAI_API_KEY when it is set; else none."""
    environ = os.environ if environ is None else environ
    if lt.api_key_env:
        if not environ.get(lt.api_key_env):
            raise ApiKeyError(f"--api-key-env / loadtest.api_key_env: the environment variable {lt.api_key_env} "
                              "is not set (export it; the key is read from there and never written to a file)")
        return lt.api_key_env
    if lt.transport == "openai" and environ.get(DEFAULT_OPENAI_KEY_ENV):
        return DEFAULT_OPENAI_KEY_ENV
    return None


def request_headers(lt, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The headers this process's own probes send: ``headers`` and the API key as a bearer token."""
    environ = os.environ if environ is None else environ
    out = dict(lt.headers)
    name = api_key_env(lt, environ)
    if name:
        out["Authorization"] = f"Bearer {environ[name]}"
    return out


def refused_words(status: int, lt) -> str:
    """What to tell the user when an endpoint answers 401/403."""
    name = lt.api_key_env or (DEFAULT_OPENAI_KEY_ENV if lt.transport == "openai" else None)
    sent = "an API key" if name and os.environ.get(name) else "no API key"
    return (f"the endpoint refused the request (HTTP {status}): it needs an API key and {sent} was sent; export the "
            f"key in an environment variable and name it with --api-key-env NAME (default {DEFAULT_OPENAI_KEY_ENV} "
            "for OpenAI endpoints), or pass --header for another scheme")
