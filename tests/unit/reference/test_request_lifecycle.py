"""Every request ends (issue 44): a request id reused while its predecessor is being retired, two
live requests under one id, a cancel for a finished id — in the engine of this process and
behind the worker process's proxy; and the bound on a request whose engine stalls.

The hang these tests pin down: upstream's ``e2e_grpc_speculative_decoding_client.py`` sends every
round's draft and target calls with the same ``request_id``. The engine thread sent a request's
final chunk, then — a moment later — dropped the id from its table of handles; a new request
under that id, submitted in between, had its handle dropped instead, and every chunk of it went
to nobody. The first test puts the second submit exactly in that moment (the ``on_chunk`` hook
runs in the engine thread between the two), so it fails on the old code every time."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from pipeline.reference.api import ENGINE_DESCRIPTOR, ENGINE_FORMAT, GenerationRequest, PromptTooLongError
from pipeline.reference.engine import create_engine
from pipeline.reference.stream import RequestStalled
from pipeline.reference.worker import EngineProcess
from tests.reference_fixtures import one_thread, random_prompts, shared_checkpoints

# a guard, not a measurement: a request that would hang fails the test instead of the run
HANG_GUARD_S = 120
PROMPT = random_prompts(1, seed=5)[0]


@pytest.fixture(scope="module")
def ckpt():
    one_thread()
    return shared_checkpoints()


@pytest.fixture(scope="module")
def target_engine(ckpt):
    """A ``target`` engine: verifies external drafts (``draft_input_ids``), as the tensorrt_llm
    model of a draft-target deployment."""
    engine = create_engine(ckpt["target"], role="target", max_draft_len=4, compute_dtype="float32")
    yield engine
    engine.shutdown()


def _draft_round(request_id: str, drafts=(7, 8, 9), new_tokens: int = 4) -> GenerationRequest:
    """One verify round (the target answers accepted drafts + 1 token in one step), or, with
    ``drafts=None``, a plain request of ``new_tokens``."""
    return GenerationRequest(list(PROMPT), new_tokens, draft_input_ids=None if drafts is None else list(drafts),
                             request_id=request_id)


def test_an_id_reused_while_its_predecessor_is_retired_is_answered(target_engine):
    """The second round under the same id is submitted from the engine thread as the first
    round's final chunk is sent (the old engine then forgot the second round's handle)."""
    second: dict = {}

    def next_round(chunk):
        if chunk.finished and "handle" not in second:
            second["handle"] = target_engine.submit(_draft_round("client-1"))

    first = target_engine.submit(_draft_round("client-1"), on_chunk=next_round)
    first.result(timeout=HANG_GUARD_S)
    result = second["handle"].result(timeout=HANG_GUARD_S)
    assert result.finish_reason == "length" and 1 <= len(result.output_ids) <= 4
    assert target_engine.stats()["open_requests"] == 0  # nothing left behind under the id


def test_two_live_requests_under_one_id_both_end(target_engine):
    handles = [target_engine.submit(_draft_round("same", drafts=None, new_tokens=6)) for _ in range(3)]
    results = [h.result(timeout=HANG_GUARD_S) for h in handles]
    assert [(r.finish_reason, len(r.output_ids)) for r in results] == [("length", 6)] * 3
    assert target_engine.stats()["open_requests"] == 0


def test_cancelling_one_handle_leaves_another_under_the_same_id(target_engine):
    a = target_engine.submit(_draft_round("twin", drafts=None, new_tokens=40))
    b = target_engine.submit(_draft_round("twin", drafts=None, new_tokens=8))
    a.cancel()
    assert a.result(timeout=HANG_GUARD_S).finish_reason == "cancelled"
    assert b.result(timeout=HANG_GUARD_S).finish_reason == "length"


def test_a_stalled_request_fails_after_its_bound(target_engine):
    """No chunk before the deadline: ``chunks`` raises RequestStalled (the Triton model turns it
    into an error response); here the engine is held by a submit it cannot start (its loop
    is blocked on the engine lock held by this test)."""
    with target_engine._lock:  # the decode loop cannot take the request while we hold this
        handle = target_engine.submit(_draft_round("stalled"))
        with pytest.raises(RequestStalled, match="stalled"):
            for _ in handle.chunks(deadline_s=0.2):
                pass
        handle.abandon()  # withdrawn from the queue the loop never read: the stream ends here
    assert handle.result(timeout=HANG_GUARD_S).finish_reason == "cancelled"
    assert target_engine.stats()["open_requests"] == 0


# -- behind the worker process's proxy ------------------------------------------------------------


@pytest.fixture(scope="module")
def worker(ckpt, tmp_path_factory):
    root = tmp_path_factory.mktemp("lifecycle-worker")
    descriptor = {"format": ENGINE_FORMAT, "role": "target", "model_dir": str(ckpt["target"]), "max_draft_len": 4,
                  "max_batch_size": 4, "max_seq_len": 96, "compute_dtype": "float32", "threads": 1}
    (root / ENGINE_DESCRIPTOR).write_text(json.dumps(descriptor))
    engine = EngineProcess(Path(root))
    yield engine
    engine.shutdown()


@pytest.mark.slow  # starts an engine worker process (its torch import: about 3.5 CPU s a module): full tier
def test_worker_two_live_requests_under_one_id_each_get_their_own_chunks(worker):
    """The proxy routed chunks by the client's id: a second live request under it took the
    first's stream over, and the first waited for ever."""
    short, long_ = _draft_round("dup", drafts=None, new_tokens=3), _draft_round("dup", drafts=None, new_tokens=12)
    a, b = worker.submit(short), worker.submit(long_)
    assert len(a.result(timeout=HANG_GUARD_S).output_ids) == 3
    assert len(b.result(timeout=HANG_GUARD_S).output_ids) == 12
    assert worker.stats()["proxy_open_requests"] == 0


@pytest.mark.slow  # starts an engine worker process (its torch import: about 3.5 CPU s a module): full tier
def test_worker_ids_reused_back_to_back_from_many_threads(worker):
    """Upstream's speculative client: every round under the client's one id, several clients."""
    errors: list[str] = []

    def client(n: int) -> None:
        for _ in range(15):
            try:
                worker.submit(_draft_round(f"client-{n}", new_tokens=2)).result(timeout=HANG_GUARD_S)
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(repr(exc))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.slow  # starts an engine worker process (its torch import: about 3.5 CPU s a module): full tier
def test_worker_cancel_by_a_finished_id_does_not_touch_its_successor(worker):
    first = worker.submit(_draft_round("again", new_tokens=2))
    first.result(timeout=HANG_GUARD_S)
    second = worker.submit(_draft_round("again", drafts=None, new_tokens=10))
    first.cancel()  # late: its request is over; the new one under the same id must go on
    assert second.result(timeout=HANG_GUARD_S).finish_reason == "length"


def test_the_engine_refuses_a_prompt_over_max_input_len_first(ckpt):
    """TensorRT-LLM's LlmRequest::validate checks the prompt against max_input_len before any
    other length: a prompt over both bounds gets the max_input_len message."""
    engine = create_engine(ckpt["target"], role="target", max_draft_len=4, max_seq_len=32, max_input_len=8)
    try:
        with pytest.raises(PromptTooLongError, match=r"^Prompt length \(9\) exceeds maximum input length \(8\)\."):
            engine.submit(GenerationRequest(list(range(1, 10)), 40))
        assert len(engine.generate(GenerationRequest(list(range(1, 9)), 2)).output_ids) == 2  # 8 is allowed
    finally:
        engine.shutdown()


# -- the Triton model's drain (pipeline/triton_models/cpu_engine_model.py), in process --------------


class _Counters:
    def __init__(self):
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, *args))


class _Sender:
    def __init__(self, cancelled: bool = False, fails: bool = False):
        self.sent: list[tuple] = []
        self._cancelled, self._fails = cancelled, fails

    def send(self, response=None, flags=0):
        if self._fails:
            raise RuntimeError("the client is gone")
        self.sent.append((response, flags))

    def is_cancelled(self) -> bool:
        return self._cancelled


class _Stream:
    """A request's stream fed by hand; records cancel and abandon."""

    def __init__(self, max_new_tokens: int = 4):
        from pipeline.reference.stream import ChunkStream

        self.stream = ChunkStream(GenerationRequest([1, 2, 3], max_new_tokens, request_id="r1"))
        self.cancels = self.abandons = 0
        self.max_new_tokens, self.request_id = max_new_tokens, "r1"

    def next_chunk(self, timeout=None):
        return self.stream.next_chunk(timeout)

    def cancel(self):
        self.cancels += 1

    def abandon(self):
        self.abandons += 1


@pytest.fixture()
def drain_model(monkeypatch):
    """A CpuEngineModel without an engine, imported against a stand-in for the Triton stub."""
    import sys
    import types

    import pipeline.triton_models as package

    stub = types.ModuleType("triton_python_backend_utils")
    stub.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", stub)
    for name in ("cpu_engine_model", "metrics", "stall"):
        monkeypatch.delitem(sys.modules, f"pipeline.triton_models.{name}", raising=False)
        monkeypatch.delattr(package, name, raising=False)
    from pipeline.triton_models import cpu_engine_model
    from pipeline.triton_models.stall import StallBound

    model = cpu_engine_model.CpuEngineModel()
    model.stall_bound, model.model_name = StallBound(floor_s=0.3, per_token_s=0.05), "tensorrt_llm"
    model.counters, model.latency = _Counters(), _Counters()
    model._lock, model._inflight = threading.Lock(), {}
    model._error_response = lambda message: ("error", message)
    yield model
    for name in ("cpu_engine_model", "metrics", "stall"):  # not bound to this stand-in in later tests
        sys.modules.pop(f"pipeline.triton_models.{name}", None)


def _drain_in_thread(model, stream, sender, respond=lambda *a: True) -> bool:
    """Run the drain; True when it returned (a guard: the old drain waited for ever)."""
    thread = threading.Thread(target=model._drain, args=("r1", stream, sender, 0, respond), daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    return not thread.is_alive()


def test_drain_fails_a_stalled_request_after_its_bound(drain_model, capfd):
    stream, sender = _Stream(max_new_tokens=4), _Sender()
    assert _drain_in_thread(drain_model, stream, sender)
    (response, flags), = sender.sent
    assert flags == 1 and response[0] == "error"
    assert response[1] == ("request 'r1' stalled: the engine sent no final response within 0.5 s "
                           "(0.3 s + 4 tokens x 0.05 s); it was cancelled and the server keeps serving, retry it")
    assert stream.abandons == 1 and ("stalled",) in drain_model.counters.calls
    assert "specdeploy: tensorrt_llm: request 'r1' stalled" in capfd.readouterr().err


def test_drain_cancels_a_request_whose_client_left_before_its_first_chunk(drain_model):
    """No chunk yet (queued, prefilling): the cancel check runs anyway."""
    from pipeline.reference.api import Chunk

    stream, sender = _Stream(max_new_tokens=400), _Sender(cancelled=True)
    drain_model.stall_bound = type(drain_model.stall_bound)(floor_s=600.0, per_token_s=0.0)

    def finish_when_cancelled():
        while not stream.cancels:
            threading.Event().wait(0.01)
        stream.stream._put(Chunk(tokens=[], finished=True, finish_reason="cancelled"))

    threading.Thread(target=finish_when_cancelled, daemon=True).start()
    assert _drain_in_thread(drain_model, stream, sender)
    assert stream.cancels == 1 and stream.abandons == 0


def test_drain_cancels_when_a_response_cannot_be_sent(drain_model):
    """A send that fails (nobody takes the responses) cancels the request in the engine."""
    from pipeline.reference.api import Chunk

    stream = _Stream(max_new_tokens=400)
    drain_model.stall_bound = type(drain_model.stall_bound)(floor_s=600.0, per_token_s=0.0)
    stream.stream._put(Chunk(tokens=[5], finished=False))

    def finish_when_cancelled():
        while not stream.cancels:
            threading.Event().wait(0.01)
        stream.stream._put(Chunk(tokens=[], finished=True, finish_reason="cancelled"))

    threading.Thread(target=finish_when_cancelled, daemon=True).start()
    assert _drain_in_thread(drain_model, stream, _Sender(), respond=lambda chunk, generated, stats: chunk.finished)
    assert stream.cancels == 1
    assert ("cancelled", 1) in drain_model.counters.calls  # one token was generated for nobody


def test_stall_bound_reads_the_environment():
    from pipeline.triton_models.stall import FLOOR_ENV, PER_TOKEN_ENV, StallBound

    assert StallBound.from_env({}).seconds(48) == 120 + 48 * 2
    assert StallBound.from_env({FLOOR_ENV: "3", PER_TOKEN_ENV: "0.05"}).seconds(20) == pytest.approx(4.0)
    with pytest.raises(ValueError, match=FLOOR_ENV):
        StallBound.from_env({FLOOR_ENV: "0"})
