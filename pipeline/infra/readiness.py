"""Is a Triton server live, ready, and is a model ready: asked through ``tritonclient`` (HTTP or
gRPC, the protocol the endpoint speaks), never by hand. Used by ``serve`` (waiting for a started
server) and ``loadtest`` (liveness between runs). Reads the server's health endpoints; writes
nothing. Any failure to get an answer counts as "not ready": a starting or dying server refuses
connections, times out or answers half a response, and the callers poll or give up on their own
deadlines."""

from __future__ import annotations

import re


def _client(url: str, transport: str, timeout_s: float):
    if transport == "http":
        # tritonclient.http rides on geventhttpclient: imported here only, and it patches nothing
        import tritonclient.http as httpclient  # noqa: PLC0415 - start-up: tritonclient (loaded when a server's readiness is polled)

        return httpclient.InferenceServerClient(re.sub(r"^https?://", "", url.rstrip("/")),
                                                connection_timeout=timeout_s, network_timeout=timeout_s)
    import tritonclient.grpc as grpcclient  # noqa: PLC0415 - start-up: tritonclient (loaded when a server's readiness is polled)

    return grpcclient.InferenceServerClient(url=re.sub(r"^(grpc|http)s?://", "", url))


def _ask(url: str, transport: str, timeout_s: float, question) -> bool:
    try:
        client = _client(url, transport, timeout_s)
    except Exception:  # noqa: BLE001 - a malformed or unreachable URL is "not ready"
        return False
    try:
        return bool(question(client, {} if transport == "http" else {"client_timeout": timeout_s}))
    except Exception:  # noqa: BLE001 - refused, reset, timed out or a 5xx: not ready (yet)
        return False
    finally:
        try:
            client.close()
        except Exception:  # noqa: BLE001 - closing a client of a dead server
            pass


def server_live(url: str, transport: str = "http", timeout_s: float = 5.0) -> bool:
    return _ask(url, transport, timeout_s, lambda c, kw: c.is_server_live(**kw))


def server_ready(url: str, transport: str = "http", timeout_s: float = 5.0) -> bool:
    return _ask(url, transport, timeout_s, lambda c, kw: c.is_server_ready(**kw))


def model_ready(url: str, model_name: str, transport: str = "http", timeout_s: float = 5.0) -> bool:
    return _ask(url, transport, timeout_s, lambda c, kw: c.is_model_ready(model_name, **kw))


def models_not_ready(url: str, models: list[str], transport: str = "http", timeout_s: float = 2.0) -> list[str]:
    """The models of ``models`` not ready yet; all of them while the server itself is not ready."""
    if not server_ready(url, transport, timeout_s):
        return list(models)
    return [m for m in models if not model_ready(url, m, transport, timeout_s)]
