"""`serve` shows the first errors of a tritonserver log, not only its tail (issue 44): the
lines Triton writes when a model fails to load, in the forms this project's servers wrote them
(the real-server case: tests/integration/test_serve_first_error.py)."""

from __future__ import annotations

from pipeline.serve.server_log import failure_report, first_errors

CAUSE = "SafetensorError: Error while deserializing header: incomplete metadata, file not fully covered"
AT = "\\n\\nAt:\\n  /repo/tensorrt_llm/1/_specdeploy/pipeline/reference/worker.py(359): _start\\n"
LOG = f"""# cpu pinning: none (not asked for)
$ tritonserver --model-repository=/repo
E1206 10:52:00.076566 21969 server.cc:241] "CudaDriverHelper has not been initialized."
I1206 10:52:01.437240 21969 model_lifecycle.cc:839] "successfully loaded 'preprocessing'"
I1206 10:52:07.001759 21969 pb_stub.cc:366] "Failed to initialize Python stub: {CAUSE}{AT}"
E1206 10:52:07.726552 21969 backend_model.cc:692] "ERROR: Failed to create instance: {CAUSE}{AT}"
E1206 10:52:07.726733 21969 model_lifecycle.cc:642] "failed to load 'tensorrt_llm' version 1: Internal: {CAUSE}{AT}"
I1206 10:52:07.726787 21969 model_lifecycle.cc:777] "failed to load 'tensorrt_llm'"
E1206 10:52:07.726853 21969 model_repository_manager.cc:703] "Invalid argument: ensemble 'ensemble' depends on 'tensorrt_llm' which has no loaded version."
E1206 10:52:07.9 21969 ensemble_scheduler.cc:1468] "unable to create stream for ensemble: CUDA driver version is insufficient for CUDA runtime version"
""" + "| table row |\n" * 60 + "Error: Failed to initialize NVML\nerror: creating server: Internal - failed to load all models\n"


def test_one_cause_per_failed_model_named_by_the_model():
    assert first_errors(LOG) == [f"tensorrt_llm: failed to load: {CAUSE}"]


def test_the_report_puts_the_cause_before_the_tail():
    report = failure_report(LOG)
    assert report.splitlines()[:2] == ["first errors in the log:", f"  tensorrt_llm: failed to load: {CAUSE}"]
    assert report.endswith("error: creating server: Internal - failed to load all models")
    assert "\nlast lines:\n" in report


def test_a_stub_abort_and_a_traceback_are_causes():
    log = ("I1206 10:43:30.005095 13569 python_be.cc:2249] \"TRITONBACKEND_ModelInstanceInitialize: probe_0_0\"\n"
           "terminate called after throwing an instance of 'std::invalid_argument'\n  what():  stol\n"
           "Traceback (most recent call last):\n  File \"model.py\", line 3, in initialize\n"
           "FileNotFoundError: tokenizer directory /m does not exist\n")
    assert first_errors(log) == [
        "a stub aborted: terminate called after throwing an instance of 'std::invalid_argument' (what():  stol)",
        "Python traceback: FileNotFoundError: tokenizer directory /m does not exist"]


def test_a_clean_log_has_no_errors_and_the_report_is_the_tail():
    log = "\n".join(f"I1206 10:00:00.0 1 server.cc:1] \"line {i}\"" for i in range(50))
    assert first_errors(log) == []
    assert failure_report(log, 3) == "last lines:\n" + "\n".join(log.splitlines()[-3:])
