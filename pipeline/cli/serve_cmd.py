"""`specdeploy serve CONFIG --variant baseline|speculative|scheduled`: start tritonserver on a rendered
repository (gRPC + HTTP + metrics, bound to ``triton.host``, 127.0.0.1 by default; ``--host 0.0.0.0``
for a load test from another machine, see docs/gpu-serving.md for what that exposes).

Reads ``engines/NAME/model_repo/<variant>/`` and writes the server log to
``engines/NAME/logs/serve-<variant>.log`` and its pid to ``engines/NAME/logs/serve-<variant>.pid``.
With ``--foreground`` it runs until Ctrl-C (or SIGTERM, SIGHUP) and stops the server cleanly, and
the server never outlives it; otherwise it leaves the ready server running in its own session
(detached from this process) and prints how to stop it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pipeline.cli.options import workdir_option
from pipeline.errors import UsageError


def register(app: typer.Typer) -> None:
    @app.command("serve", help="Start tritonserver on a rendered repository (gRPC + HTTP + metrics).")
    def serve_command(
        config: str = typer.Argument(..., help="Deployment config YAML."),
        variant: str = typer.Option("speculative", "--variant", help="baseline, speculative, or scheduled (rendered by `render --schedule`)."),
        http_port: Optional[int] = typer.Option(None, "--http-port", help="Default: triton.http_port."),
        grpc_port: Optional[int] = typer.Option(None, "--grpc-port", help="Default: triton.grpc_port."),
        metrics_port: Optional[int] = typer.Option(None, "--metrics-port", help="Default: triton.metrics_port."),
        foreground: bool = typer.Option(False, "--foreground", help="Run until Ctrl-C, then stop the server."),
        host: Optional[str] = typer.Option(
            None, "--host", help="Address to bind (default: triton.host, 127.0.0.1). 0.0.0.0 lets other machines "
            "reach every port, unauthenticated: only on a trusted network."),
        workdir: Optional[Path] = workdir_option(),
        frontend: str = typer.Option("triton", "--frontend", help="triton (Triton's own HTTP/gRPC) or openai "
                                     "(also an OpenAI-compatible /v1 frontend, docs/openai-endpoints.md)."),
        openai_port: Optional[int] = typer.Option(None, "--openai-port", help="--frontend openai: its port "
                                                  "(default triton.http_port + 10)."),
        skip_live: bool = typer.Option(False, "--skip-live", help="trtllm: serve without the live preflight "
                                       "(installed TensorRT-LLM, Triton, GPUs); recorded in the provenance."),
    ) -> int:
        if frontend not in ("triton", "openai"):

            raise UsageError(f"--frontend must be 'triton' or 'openai', got {frontend!r}")
        if host is not None:
            _check_host(host)  # argument errors first, before the live preflight's seconds
        _live_gate(config, workdir, skip_live)
        if frontend == "openai":
            return _serve_openai(config, variant, http_port, grpc_port, metrics_port, foreground, host, openai_port, workdir)
        return serve(config, variant, http_port, grpc_port, metrics_port, foreground, host, workdir)


def _live_gate(config: str, workdir: Path | None, skip_live: bool) -> None:
    """backend trtllm: the live preflight before a server starts (``--skip-live``: recorded, skipped)."""
    from rich.console import Console

    from pipeline.config import load_config
    from pipeline.validate.live.gate import require_live

    require_live(load_config(config, workdir), skip=skip_live, stage="serve", console=Console())


def _serve_openai(config, variant, http_port, grpc_port, metrics_port, foreground, host, openai_port, workdir) -> int:
    from pipeline.config import load_config
    from pipeline.serve.openai_serve import serve_with_frontend

    if variant not in ("baseline", "speculative"):
        raise UsageError(f"--variant must be 'baseline' or 'speculative', got {variant!r}")
    cfg = load_config(config, workdir)
    if host is not None:
        _check_host(host)
    ports = dict(http_port=http_port or cfg.triton.http_port, grpc_port=grpc_port or cfg.triton.grpc_port,
                 metrics_port=metrics_port or cfg.triton.metrics_port)
    return serve_with_frontend(cfg, variant, ports=ports, host=host, foreground=foreground, openai_port=openai_port)


def serve(config: str, variant: str, http_port: int | None, grpc_port: int | None,
          metrics_port: int | None, foreground: bool, host: str | None = None, workdir: Path | None = None) -> int:
    from pipeline.config import load_config
    from pipeline.serve.server import serve_foreground, start_deployment

    if variant not in ("baseline", "speculative"):
        raise UsageError(f"--variant must be 'baseline' or 'speculative', got {variant!r}")
    cfg = load_config(config, workdir)
    ports = dict(http_port=http_port or cfg.triton.http_port, grpc_port=grpc_port or cfg.triton.grpc_port,
                 metrics_port=metrics_port or cfg.triton.metrics_port)
    if host is not None:
        _check_host(host)
    if foreground:
        return serve_foreground(cfg, variant, host=host, **ports)
    server = start_deployment(cfg, variant, host=host, **ports)
    server.detach()
    print(f"serving {cfg.name} ({variant}) pid {server.pid}\n  HTTP    {server.http_url}\n"
          f"  gRPC    {server.grpc_url}\n  metrics {server.metrics_url}\n  log     {server.log_path}\n"
          f"stop it with: kill -TERM -- -{server.pid}   (pid also in {server.pid_file})")
    return 0


def _check_host(host: str) -> None:
    import ipaddress


    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise UsageError(f"--host: {host!r} is not an IP address (e.g. 127.0.0.1, 0.0.0.0)") from None
