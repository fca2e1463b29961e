"""A port taken while the models load: ``start_server`` picks three free ports, but tritonserver
binds them only after loading every model, so another process can take one meanwhile (seen in CI:
another test's server took the HTTP port, answered the readiness poll for models of the same
names, and the tests then found nothing on the gRPC port). Here a stand-in "foreign server" takes
the picked HTTP port right after the launch and answers every readiness request with 200: the
start must not count it as ours, and must come up on new ports, the first attempt's log kept.
A start that did not die (still loading at its timeout) is not tried again: it would cost the
timeout once per try. The negative control switches the own-socket check off: the start then returns on the foreign
server's word, with nothing of ours listening.

Reads the shipped tiny config (through test_triton_smoke's repository); writes under tmp_path."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from test_triton_smoke import PROMPT, _repository

from pipeline.infra.processes import port_in_use
from pipeline.serve import server as server_mod
from triton_clients import grpc_infer

pytestmark = [pytest.mark.triton, pytest.mark.slow]


class _AlwaysReady(BaseHTTPRequestHandler):
    def do_GET(self):  # http.server calls it by this name
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture()
def foreign_takes_the_http_port(monkeypatch):
    """After the first launch, a foreign server binds that launch's HTTP port → the foreign servers."""
    foreign: list[ThreadingHTTPServer] = []
    launch = server_mod._launch

    def launch_then_take(argv, *args, **kwargs):
        process = launch(argv, *args, **kwargs)
        if not foreign:
            port = int(next(a for a in argv if a.startswith("--http-port=")).split("=", 1)[1])
            httpd = ThreadingHTTPServer(("127.0.0.1", port), _AlwaysReady)
            threading.Thread(target=httpd.serve_forever, daemon=True).start()
            foreign.append(httpd)
        return process

    monkeypatch.setattr(server_mod, "_launch", launch_then_take)
    yield foreign
    for httpd in foreign:
        httpd.shutdown()
        httpd.server_close()


def test_a_port_taken_during_loading_is_not_mistaken_for_ours(tmp_path, foreign_takes_the_http_port, capsys):
    from pipeline.triton_models.tokenizer import TextTokenizer

    repo, tokenizer_dir = _repository(tmp_path)
    server = server_mod.start_server(repo, startup_timeout_s=120)
    try:
        (foreign,) = foreign_takes_the_http_port
        taken = foreign.server_address[1]
        assert server.ports.http != taken and server.listens_on(server.ports.http)
        pre = grpc_infer(server.grpc_url, "preprocessing", {
            "QUERY": np.array([[PROMPT.encode()]], dtype=np.object_),
            "REQUEST_OUTPUT_LEN": np.array([[4]], dtype=np.int32)})
        assert pre["INPUT_ID"].tolist() == [TextTokenizer(tokenizer_dir).encode(PROMPT)]
        log = server.log_path.read_text()
        assert f"# attempt 1: port(s) [{taken}] were taken by another process" in log
        assert f"--http-port={taken}" in log and f"--http-port={server.ports.http}" in log  # both attempts' logs
        assert log.count("# cpu pinning:") == 1 and log.index("# cpu pinning:") == 0  # the header once, on top
        assert f"could not bind port(s) [{taken}]" in capsys.readouterr().err
    finally:
        server.stop()


def test_negative_control_without_the_own_socket_check_the_foreign_server_answers(
        tmp_path, foreign_takes_the_http_port, monkeypatch):
    repo, _ = _repository(tmp_path)
    monkeypatch.setattr(server_mod.RunningServer, "listens_on", lambda self, port: True)
    server = server_mod.start_server(repo, startup_timeout_s=120)
    try:
        (foreign,) = foreign_takes_the_http_port
        assert server.ports.http == foreign.server_address[1]  # "ready" on the foreign server's word
        assert not port_in_use(server.ports.grpc, "127.0.0.1")  # nothing of ours listens yet
    finally:
        server.stop()


def test_a_start_that_timed_out_is_not_tried_again(tmp_path, monkeypatch):
    """Only a server that exited while starting is started again on new ports; a timeout (here
    right away, the picked ports reported taken) raises after one launch."""
    repo, _ = _repository(tmp_path)
    launches = []
    launch = server_mod._launch

    def counted(*args, **kwargs):
        launches.append(args[0])
        return launch(*args, **kwargs)

    def timed_out(server, models, timeout_s, own_ports=False):
        server.stop()
        raise server_mod.ServeError("tritonserver not ready within 1 s")

    monkeypatch.setattr(server_mod, "_launch", counted)
    monkeypatch.setattr(server_mod, "wait_ready", timed_out)
    monkeypatch.setattr(server_mod, "port_in_use", lambda port, host: True)
    with pytest.raises(server_mod.ServeError, match="not ready within") as raised:
        server_mod.start_server(repo, startup_timeout_s=1)
    assert len(launches) == 1 and not isinstance(raised.value, server_mod.ServerDiedError)
