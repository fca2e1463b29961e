"""Strict config loading and the paths / CPUs a later stage needs, checked by `validate`:
duplicate YAML keys at any depth (field path + both lines; anchors and merge keys keep working),
the prompt set resolved and parsed as the load test reads it, checkpoint directories named in both
forms when relative, and explicit ``reference.cpu_pinning`` ids against the real affinity mask of
the process (a child started on fewer CPUs sees fewer). Each rule has an end-to-end case through
the real ``specdeploy validate`` (``python -m pipeline``): exit code and message."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.config import DuplicateKeyError, load_config, load_yaml_strict
from pipeline.errors import ConfigError
from pipeline.infra.cpu_pinning import format_cpus, spawn_on
from pipeline.loadtest.inputs import PromptSetError, load_prompt_set
from pipeline.validate.checkpoints import checkpoint_dir_problem
from pipeline.validate.preflight import errors_of, run_preflight
from tests.unit.cli_inproc import CliResult, specdeploy

ROOT = Path(__file__).resolve().parents[3]
ALLOWED = sorted(os.sched_getaffinity(0))

# A CPU config with one engine model per arm (Medusa), checked --offline: nothing is trained.
MEDUSA = """\
name: strict-medusa
backend: reference
hardware: cpu
target:
  checkpoint: builtin:tiny-target
  dtype: float32
speculation:
  method: medusa
  heads_dir: builtin:tiny-medusa
  num_heads: 2
build:
  max_batch_size: 4
  max_input_len: 256
  max_seq_len: 512
reference:
  threads: 1
{reference}
loadtest:
  concurrency: [1, 2]
  prompts: {prompts}
"""


def medusa_yaml(prompts: str = "prompts/tiny", reference: str = "") -> str:
    return MEDUSA.format(prompts=prompts, reference=textwrap.indent(reference, "  ") if reference else "")


def write(directory: Path, text: str, name: str = "deploy.yaml") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def validate_cli(config: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """The console entry point as a user runs it (``specdeploy validate``), in a process of its own:
    for claims about the working directory it runs in or the CPUs it may use."""
    return subprocess.run([sys.executable, "-m", "pipeline", "validate", str(config), *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300)


def validate_here(config: Path, *args: str) -> CliResult:
    """``specdeploy validate`` in this process (same output and exit code, no interpreter start)."""
    return specdeploy("validate", str(config), *args)


def problems_of(exc: ConfigError) -> list[str]:
    return exc.problems


# ----------------------------------------------------------------------------------------------
# Duplicate keys


@pytest.mark.parametrize("text, expected", [
    ("name: a\nname: b\n", "name: duplicate key 'name' at lines 1 and 2"),
    ("loadtest:\n  concurrency: [1]\n  duration_s: 5\n  concurrency: [2]\n",
     "loadtest.concurrency: duplicate key 'concurrency' at lines 2 and 4"),
    ("loadtest:\n  sampling:\n    top_k: 1\n    top_p: 0.5\n    top_k: 4\n",
     "loadtest.sampling.top_k: duplicate key 'top_k' at lines 3 and 5"),
    ("speculation:\n  draft:\n    quantization:\n      format: none\n      format: int8_wo\n",
     "speculation.draft.quantization.format: duplicate key 'format' at lines 4 and 5"),
    ("triton: {http_port: 1, http_port: 2}\n", "triton.http_port: duplicate key 'http_port' at lines 1 and 1"),
    ("speculation:\n  choices:\n    - [0]\nx:\n  - {a: 1}\n  - {b: 1, b: 2}\n",
     "x[1].b: duplicate key 'b' at lines 6 and 6"),
    ('name: a\n"name": b\n', "name: duplicate key 'name' at lines 1 and 2"),  # quoting does not make a new key
])
def test_a_repeated_key_at_any_depth_names_its_path_and_both_lines(text, expected):
    with pytest.raises(DuplicateKeyError) as info:
        load_yaml_strict(text)
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith(expected), info.value.problems


def test_every_duplicate_is_reported_at_once_in_file_order(tmp_path):
    text = medusa_yaml() + "name: again\ntarget:\n  dtype: float32\n"
    path = write(tmp_path, text.replace("  num_heads: 2\n", "  num_heads: 2\n  num_heads: 3\n"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    lines = problems_of(info.value)
    assert [line.split(":")[0] for line in lines] == ["speculation.num_heads", "name", "target"], lines
    assert "lines 10 and 11" in lines[0] and "lines 1 and " in lines[1]


def test_anchors_aliases_and_merge_keys_still_load(tmp_path):
    text = textwrap.dedent("""\
        name: merged
        backend: reference
        hardware: cpu
        target: &model
          checkpoint: builtin:tiny-target
          dtype: float32
        speculation:
          method: draft_target
          draft:
            <<: *model
            checkpoint: builtin:tiny-draft
        loadtest:
          concurrency: &levels [1, 2]
        gate:
          target_concurrency: *levels
        """)
    cfg = load_config(write(tmp_path, text))
    assert cfg.draft.checkpoint == "builtin:tiny-draft" and cfg.draft.dtype == "float32"
    assert cfg.target.checkpoint == "builtin:tiny-target"
    assert cfg.gate.target_concurrency == [1, 2]


def test_a_key_repeated_inside_an_anchor_is_reported_once_where_it_is_written():
    text = "a: &x\n  k: 1\n  k: 2\nb: *x\nc:\n  <<: *x\n"
    with pytest.raises(DuplicateKeyError) as info:
        load_yaml_strict(text)
    assert info.value.problems == [
        "a.k: duplicate key 'k' at lines 2 and 3 (YAML would silently keep the last value; keep one)"]


def test_pydantic_errors_still_name_the_field_path(tmp_path):
    path = write(tmp_path, medusa_yaml().replace("  num_heads: 2\n", "  num_heads: 99\n"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert any(line.startswith("speculation.num_heads:") for line in problems_of(info.value))


def test_validate_refuses_a_duplicate_key(tmp_path):
    text = medusa_yaml().replace("  concurrency: [1, 2]\n", "  concurrency: [1, 2]\n  concurrency: [4]\n")
    first = text.splitlines().index("  concurrency: [1, 2]") + 1
    proc = validate_here(write(tmp_path, text), "--offline")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"loadtest.concurrency: duplicate key 'concurrency' at lines {first} and {first + 1}" in proc.stderr
    assert "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------------------------
# Prompt sets


def prompt_errors(tmp_path: Path, prompts: str, cwd: Path | None = None) -> list:
    config = write(tmp_path / "cfg", medusa_yaml(prompts=prompts))
    old = Path.cwd()
    os.chdir(cwd or tmp_path)
    try:
        findings = run_preflight(load_config(config), offline=True)
    finally:
        os.chdir(old)
    return [f for f in errors_of(findings) if f.check == "prompts"]


def test_a_missing_relative_prompt_dir_names_the_field_and_every_place_looked(tmp_path):
    (errors,) = prompt_errors(tmp_path, "sets/missing")
    assert errors.field == "loadtest.prompts"
    assert errors.message.startswith("sets/missing does not exist")
    for where in (tmp_path / "sets/missing", ROOT / "sets/missing", tmp_path / "cfg" / "sets/missing"):
        assert str(where) in errors.message


@pytest.mark.parametrize("files, expected", [
    ({}, "holds no <category>.jsonl prompt files"),
    ({"chat.jsonl": ""}, "no prompts in"),
    ({"chat.jsonl": '{"id": "1", "prompt": "hi"}\n{"id": "2", "prompt": "oops"\n'}, "chat.jsonl:2: not JSON"),
    ({"chat.jsonl": '{"id": "1", "text": "hi"}\n'}, "chat.jsonl:1: field 'prompt': missing"),
    ({"chat.jsonl": '{"id": "1", "prompt": null}\n'}, "chat.jsonl:1: field 'prompt': expected non-empty text"),
    ({"chat.jsonl": '["id", "prompt"]\n'}, "chat.jsonl:1: expected a JSON object ({id, category, prompt})"),
    ({"chat.jsonl": b'{"id": "1", "prompt": "caf\xe9"}\n'}, "chat.jsonl: not UTF-8 text"),
])
def test_an_unusable_prompt_dir_says_what_is_wrong(tmp_path, files, expected):
    sets = tmp_path / "sets"
    sets.mkdir()
    for name, content in files.items():
        (sets / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    (error,) = prompt_errors(tmp_path, str(sets))
    assert error.field == "loadtest.prompts" and expected in error.message, error.message


def test_a_single_prompt_file_and_a_config_relative_dir_are_accepted_as_the_load_test_reads_them(tmp_path):
    sets = tmp_path / "cfg" / "sets"
    sets.mkdir(parents=True)
    (sets / "chat.jsonl").write_text('{"id": "c1", "prompt": "hello"}\n', encoding="utf-8")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert prompt_errors(tmp_path, str(sets / "chat.jsonl")) == []
    assert prompt_errors(tmp_path, "sets", cwd=elsewhere) == []  # found next to the config
    cfg = load_config(tmp_path / "cfg" / "deploy.yaml")
    old = Path.cwd()
    os.chdir(elsewhere)
    try:
        prompts, dataset = load_prompt_set(cfg)
    finally:
        os.chdir(old)
    assert dataset["path"] == str(sets) and prompts[0]["category"] == "chat"


def test_unknown_categories_are_a_validate_error(tmp_path):
    config = write(tmp_path, medusa_yaml() + "  categories: [prose, poetry]\n")
    errors = errors_of(run_preflight(load_config(config), offline=True))
    assert [(f.field, f.check) for f in errors] == [("loadtest.categories", "prompts")]
    assert "['poetry'] not found" in errors[0].message


def test_the_load_test_raises_the_same_error(tmp_path):
    cfg = load_config(write(tmp_path, medusa_yaml(prompts=str(tmp_path / "absent"))))
    with pytest.raises(PromptSetError, match=r"^loadtest.prompts: .*/absent does not exist$"):
        load_prompt_set(cfg)


@pytest.mark.slow  # a subprocess of its own (about 1 CPU s): full tier, the quick tier keeps the in-process checks
def test_validate_refuses_a_missing_prompt_dir(tmp_path):
    proc = validate_cli(write(tmp_path, medusa_yaml(prompts="prompts/nope")), "--offline", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "loadtest.prompts: prompts/nope does not exist" in proc.stderr
    assert str(tmp_path / "prompts/nope") in proc.stderr and "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------------------------
# Checkpoint directories (build host: validate without --offline)


GPU = """\
name: strict-gpu
hardware: h100-sxm-80gb
target:
  checkpoint: {target}
build: {{max_batch_size: 4, max_input_len: 256, max_seq_len: 512}}
"""


def test_a_relative_checkpoint_path_is_named_as_written_and_as_the_build_resolves_it(tmp_path):
    problem = checkpoint_dir_problem(Path("models/llama"))
    assert problem == f"models/llama (relative to the working directory: {Path.cwd() / 'models/llama'}) does not exist"
    (tmp_path / "weights").write_text("not a directory")
    assert checkpoint_dir_problem(tmp_path / "weights") == f"{tmp_path / 'weights'} is not a directory"
    assert checkpoint_dir_problem(tmp_path) is None


@pytest.mark.slow  # a subprocess of its own (about 1 CPU s): full tier, the quick tier keeps the in-process checks
def test_validate_names_a_missing_relative_checkpoint_in_both_forms(tmp_path):
    proc = validate_cli(write(tmp_path, GPU.format(target="models/llama-8b")), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    expected = (f"target.checkpoint: target checkpoint directory models/llama-8b (relative to the working "
                f"directory: {tmp_path / 'models/llama-8b'}) does not exist")
    assert expected in proc.stderr, proc.stderr


def test_validate_says_a_checkpoint_path_that_is_a_file_is_not_a_directory(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\0")
    # an absolute path: nothing here depends on the working directory, so no process of its own
    proc = validate_here(write(tmp_path, GPU.format(target=tmp_path / "model.safetensors")))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"target checkpoint directory {tmp_path / 'model.safetensors'} is not a directory" in proc.stderr


# ----------------------------------------------------------------------------------------------
# CPU ids against the process's affinity mask


def test_cpu_lists_print_in_the_kernel_cpulist_form():
    assert format_cpus([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert format_cpus([5]) == "5" and format_cpus([]) == "none"


def test_validate_refuses_a_cpu_beyond_the_allowed_set(tmp_path):
    beyond = max(ALLOWED) + 1
    config = write(tmp_path, medusa_yaml(reference=f"cpu_pinning: [{beyond}]"))
    proc = validate_here(config, "--offline")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (f"reference.cpu_pinning: CPU(s) [{beyond}] are not allowed here; this process may run on CPUs "
            f"{format_cpus(ALLOWED)} only") in proc.stderr, proc.stderr


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
@pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two allowed CPUs to start a child on fewer")
def test_a_child_started_on_fewer_cpus_refuses_a_cpu_it_may_not_use(tmp_path):
    lowest, highest = ALLOWED[0], ALLOWED[-1]
    config = write(tmp_path, medusa_yaml(reference=f"cpu_pinning: [{highest}]"))
    # the full set leaves CPU `lowest` to the server (this process's own mask: in-process suffices)
    assert validate_here(config, "--offline").returncode == 0
    with spawn_on([lowest]):  # the child inherits this thread's affinity: a real, smaller mask
        proc = validate_cli(config, "--offline")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"reference.cpu_pinning: CPU(s) [{highest}] are not allowed here; this process may run on CPUs {lowest} only" \
        in proc.stderr, proc.stderr


@pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two allowed CPUs")
def test_too_few_cpus_for_the_bls_arm_and_every_cpu_taken_are_validate_errors(tmp_path):
    bls = medusa_yaml(reference=f"cpu_pinning: [{ALLOWED[-1]}]").replace(
        "  method: medusa\n  heads_dir: builtin:tiny-medusa\n  num_heads: 2\n",
        "  method: draft_target\n  draft:\n    checkpoint: builtin:tiny-draft\n    dtype: float32\n")
    (error,) = errors_of(run_preflight(load_config(write(tmp_path, bls)), offline=True))
    assert error.field == "reference.cpu_pinning" and "lists 1 CPU(s); 2 engine model(s)" in error.message
    every = medusa_yaml(reference=f"cpu_pinning: {ALLOWED}")
    (error,) = errors_of(run_preflight(load_config(write(tmp_path, every, "every.yaml")), offline=True))
    assert "takes every allowed CPU" in error.message


def test_a_cpu_list_on_the_gpu_backend_is_flagged_as_ignored():
    from pipeline.config import parse_config

    cfg = parse_config({"name": "g", "target": {"checkpoint": "/models/x"}, "reference": {"cpu_pinning": [0]}})
    findings = [f for f in run_preflight(cfg, offline=True) if f.check == "cpu-ids"]
    assert [(f.severity, f.field) for f in findings] == [("warning", "reference.cpu_pinning")]
