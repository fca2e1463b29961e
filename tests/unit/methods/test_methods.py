"""The method registry (pipeline/methods/): one module per speculation method, and the stages ask
the method object instead of comparing its name.

The name check reads every module under pipeline/ outside pipeline/methods/ for a comparison of
the method's name (``method ==``, ``method !=``, ``method in (``…) and fails on any; the type check
fails on an ``isinstance`` against a method's config section (its ``…Spec`` class) there: a new
method must not need a tour of the house, and a stage asks the method's hooks instead. Lookahead's facts (its draft length, its Triton parameters, the
LLM API's refusal) are checked against what upstream's sources say (tags in the method module).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import get_args

import pytest

from pipeline.config import METHOD_NAMES, METHOD_SECTIONS, parse_config
from pipeline.facts.hardware import get_profile
from pipeline.facts.memory_fit import GIB, estimate_memory
from pipeline.facts.model_shapes import known_shape
from pipeline.forecast.proposers import PLANS, PROPOSER_COSTS, StepContext
from pipeline.forecast.roofline import model_cost
from pipeline.methods import ENGINE, LLM_API, METHODS, REFERENCE, get_method, method_for_engine_mode
from pipeline.methods.lookahead import lookahead_max_draft_len
from pipeline.paths import PROJECT_ROOT
from pipeline.plan.planner import make_plan
from pipeline.render.renderer import trtllm_parameters
from pipeline.validate.preflight import errors_of, run_preflight
from tests.python_source import parsed

PIPELINE = PROJECT_ROOT / "pipeline"
# a comparison of a speculation method's name: `method == "x"`, `cfg.method != 'x'`, `method in ("a", …)`,
# `spec.method not in [...]`, `args.method == "x"` (the before-stop hook's grep, widened to `not in`, [ and {)
NAME_COMPARISON = re.compile(r"""\bmethod\s*(==|!=|(not\s+)?in)\s*[("'\[{]""")


def name_comparisons(root: Path) -> list[str]:
    hits = []
    for path in sorted(root.rglob("*.py")):
        if (root / "methods") in path.parents:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if NAME_COMPARISON.search(line):
                hits.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return hits


def test_no_stage_compares_the_method_name():
    hits = name_comparisons(PIPELINE)
    assert hits == [], "ask the method object (cfg.method_info, pipeline.methods) instead:\n" + "\n".join(hits)


def test_the_name_check_finds_what_it_looks_for(tmp_path):
    (tmp_path / "methods").mkdir()
    (tmp_path / "methods" / "medusa.py").write_text('if cfg.method == "medusa": pass\n')  # the method's own home
    (tmp_path / "stage.py").write_text('a = cfg.method_info.draft_model\nmode = cfg.method\n')
    assert name_comparisons(tmp_path) == []
    for line in ('if cfg.method == "medusa":', "if spec.method != 'none':", 'if method in ("medusa", "eagle"):',
                 'ok = args.method not in ["ngram"]', 'x = method in {"eagle"}'):
        (tmp_path / "stage.py").write_text(line + "\n")
        assert len(name_comparisons(tmp_path)) == 1, line


SECTION_NAMES = frozenset(m.section.__name__ for m in METHODS.values())


def section_type_checks(root: Path, sections: frozenset[str] = SECTION_NAMES) -> list[str]:
    """``isinstance(x, <Section>)`` (or a tuple naming one) outside ``root/methods``, read with ``ast``."""
    hits = []
    for path in sorted(root.rglob("*.py")):
        if (root / "methods") in path.parents:
            continue
        for node in ast.walk(parsed(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
                    and len(node.args) == 2):
                continue
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            names = {k.id if isinstance(k, ast.Name) else getattr(k, "attr", None) for k in kinds}
            if names & sections:
                hits.append(f"{path.relative_to(root)}:{node.lineno}: isinstance on {', '.join(sorted(names & sections))}")
    return hits


@pytest.mark.budget(4)  # the first of the module's AST checks in a process parses every file of pipeline/ (~2 CPU s)
def test_no_stage_checks_a_method_section_type():
    hits = section_type_checks(PIPELINE)
    assert hits == [], "add a hook to pipeline/methods/base.py and override it in the method:\n" + "\n".join(hits)


def test_the_type_check_finds_what_it_looks_for(tmp_path):
    (tmp_path / "methods").mkdir()
    (tmp_path / "methods" / "medusa.py").write_text("ok = isinstance(spec, MedusaSpec)\n")  # the method's own home
    (tmp_path / "stage.py").write_text("ok = isinstance(spec, ModelSpec)\n")  # not a method's section
    assert section_type_checks(tmp_path) == []
    for line in ("if isinstance(spec, MedusaSpec): pass", "x = isinstance(cfg.speculation, (EagleSpec, Eagle3Spec))",
                 "x = isinstance(s, config.DraftTargetSpec)"):
        (tmp_path / "stage.py").write_text(line + "\n")
        assert len(section_type_checks(tmp_path)) == 1, line


# the per-method tables still outside pipeline/methods/, each with why it is not a hook; the list may only shrink
PER_METHOD_TABLES = {
    # the CPU engine's own registry of runtime proposers: reference/ sits above methods/ and is copied into
    # the served repositories, which import no config (a method names its proposer by this key: Method.proposer)
    "reference/proposers/__init__.py": "BUILDERS",
    # engine.json's proposer union: the descriptor is the CPU engine's contract, read by reference/ (as above)
    "artefacts/engine.py": "ProposerSpec",
    # upstream's SpeculativeDecodingMode bit flags, keyed by engine mode (two of which are named as methods)
    "trtllm/engine_config.py": "SPEC_MODE_BITS",
}
DESCRIPTOR_NAMES = frozenset({"NoProposer", "DraftTargetProposer", "MedusaProposer", "EagleProposer", "Eagle3Proposer",
                              "NgramProposer", "LookaheadProposer"})


def per_method_tables(root: Path, methods: frozenset[str] = frozenset(METHODS) - {"none"},
                      classes: frozenset[str] = SECTION_NAMES | DESCRIPTOR_NAMES) -> list[str]:
    """Tables keyed by method outside ``root/methods``: a dict literal with two or more keys that are
    method names or a method's config section / engine-descriptor class, or a tuple, list or set
    naming two or more of those classes (a union, a registry)."""
    hits = []
    for path in sorted(root.rglob("*.py")):
        if (root / "methods") in path.parents:
            continue
        for node in ast.walk(parsed(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Dict):
                keys = {k.value if isinstance(k, ast.Constant) else getattr(k, "id", getattr(k, "attr", None))
                        for k in node.keys if k is not None}
                found = keys & (methods | classes)
            elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                found = {getattr(e, "id", getattr(e, "attr", None)) for e in node.elts} & classes
            else:
                continue
            if len(found) >= 2:
                hits.append(f"{path.relative_to(root).as_posix()}:{node.lineno}: keyed by {', '.join(sorted(found))}")
    return hits


def test_no_new_per_method_table_outside_the_methods():
    hits = per_method_tables(PIPELINE)
    files = {hit.split(":")[0] for hit in hits}
    new = [hit for hit in hits if hit.split(":")[0] not in PER_METHOD_TABLES]
    assert new == [], "a fact of each method is a hook of its Method (pipeline/methods/base.py):\n" + "\n".join(new)
    assert set(PER_METHOD_TABLES) <= files, f"gone, take them off PER_METHOD_TABLES: {set(PER_METHOD_TABLES) - files}"
    assert len(hits) == len(files), hits  # one table per listed file


def test_the_table_check_finds_what_it_looks_for(tmp_path):
    (tmp_path / "methods").mkdir()
    (tmp_path / "methods" / "registry.py").write_text('T = {"medusa": 1, "eagle": 2}\n')  # the methods' own home
    (tmp_path / "stage.py").write_text('T = {"medusa": 1}\nU = (MedusaSpec,)\nV = {"x": 1, "y": 2}\n')  # one is no table
    assert per_method_tables(tmp_path) == []
    for line in ('FLAGS = {"medusa": a, "eagle": b}', "U = Union[MedusaSpec, EagleSpec]", "S = [sections.NgramSpec, MtpSpec]",
                 "B = {DraftTargetProposer: f, NgramProposer: g}", 'R = {"draft_target": 1, "ngram": 2, "other": 3}'):
        (tmp_path / "stage.py").write_text(line + "\n")
        assert len(per_method_tables(tmp_path)) == 1, line


def test_every_step_flag_fills_a_field_of_its_engine_descriptor():
    """The CPU build step writes a method's flags into its engine.json proposer: each flag names a
    field of that proposer's descriptor (pipeline/artefacts/engine.py), and a shared flag has one type."""
    from pipeline.artefacts.engine import ProposerSpec
    from pipeline.build.reference_step import parser

    descriptors = {d.model_fields["method"].default: d for d in get_args(get_args(ProposerSpec)[0])}
    for method in METHODS.values():
        for flag in method.step_flags:
            assert flag.field in descriptors[method.proposer].model_fields, (method.name, flag)
            assert (flag.checkpoint is not None) == (flag.type == "checkpoint"), (method.name, flag)
    flags = {action.option_strings[0] for action in parser()._subparsers._group_actions[0].choices["engine"]._actions
             if action.option_strings}
    assert {f.flag for m in METHODS.values() for f in m.step_flags} <= flags


def _imported(path: Path) -> set[str]:
    """Dotted names a file imports anywhere (functions and TYPE_CHECKING included): ``from a.b import c`` gives a.b.c."""
    names = set()
    for node in ast.walk(parsed(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def config_method_ties(root: Path) -> list[str]:
    """A config module naming a method module (it takes the sections from the registry, ``pipeline.methods``),
    and a method module naming the config (its sections build on ``pipeline.config_base``)."""
    hits = []
    for path in sorted((root / "config").rglob("*.py")):
        hits += [f"config/{path.name} imports {n}" for n in sorted(_imported(path))
                 if n.startswith("pipeline.methods.") and n.split(".")[2] not in ("METHODS", "Method", "get_method")]
    for path in sorted((root / "methods").rglob("*.py")):
        hits += [f"methods/{path.name} imports {n}" for n in sorted(_imported(path))
                 if n == "pipeline.config" or n.startswith("pipeline.config.")]
    return hits


def test_the_config_reads_the_registry_and_the_methods_never_the_config():
    assert config_method_ties(PIPELINE) == []


def test_the_tie_check_finds_what_it_looks_for(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "methods").mkdir()
    (tmp_path / "config" / "deployment.py").write_text("from pipeline.methods import METHODS, Method\n")
    (tmp_path / "methods" / "medusa.py").write_text("from pipeline.config_base import Section\n")
    assert config_method_ties(tmp_path) == []
    for where, line in (("config/deployment.py", "from pipeline.methods.medusa import MedusaSpec"),
                        ("config/deployment.py", "import pipeline.methods.eagle"),
                        ("methods/medusa.py", "from pipeline.config import DeploymentConfig"),
                        ("methods/medusa.py", "if TYPE_CHECKING:\n    from pipeline.config.deployment import DeploymentConfig")):
        original = (tmp_path / where).read_text()
        (tmp_path / where).write_text(line + "\n")
        assert len(config_method_ties(tmp_path)) == 1, line
        (tmp_path / where).write_text(original)


def test_registry_lists_every_method_once_in_the_config_order():
    assert tuple(METHODS) == METHOD_NAMES == (
        "none", "draft_target", "medusa", "eagle", "eagle3", "ngram", "mtp", "lookahead")
    for method, section in zip(METHODS.values(), METHOD_SECTIONS, strict=True):
        assert method.section is section and section.model_fields["method"].annotation.__args__ == (method.name,)
        assert method.title and method.runtimes <= {ENGINE, LLM_API, REFERENCE}
        assert (method.llmapi_decoding_type is None) or LLM_API in method.runtimes, method.name
        assert not (method.engine_only_decoding_type and LLM_API in method.runtimes), method.name
        assert (method.proposer is not None) == (REFERENCE in method.runtimes and method.speculative), method.name
    with pytest.raises(KeyError, match="valid: none, draft_target"):
        get_method("redrafter")


def test_every_reference_proposer_a_method_names_is_registered():
    from pipeline.reference.proposers import BUILDERS

    missing = {m.proposer for m in METHODS.values() if m.proposer} - set(BUILDERS)
    assert missing == set(), missing


def test_triton_parameters_are_upstream_parameters():
    """Every parameter a method sets exists in upstream's tensorrt_llm config.pbtxt (the renderer's
    full list), and a served decoding_mode maps back to its method."""
    cfg = parse_config({"name": "x", "target": {"checkpoint": "/m"}})
    from pipeline.render.renderer import LlmSettings

    upstream = set(trtllm_parameters(cfg, LlmSettings("tensorrt_llm", "/e", True), {}))
    for method in METHODS.values():
        assert set(method.required_triton_parameters) <= upstream, method.name
        if method.triton_decoding_mode:
            assert method_for_engine_mode(method.engine_mode) is method


# ----------------------------------------------------------------------------------------------
# Lookahead


@pytest.mark.parametrize("w,n,g,expected", [(7, 7, 7, 83), (4, 3, 4, 15), (5, 1, 3, 0), (1, 2, 1, 1), (3, 3, 3, 11)])
def test_lookahead_draft_len_as_upstream_computes_it(w, n, g, expected):
    """(N == 1 ? 0 : N − 2) + (W − 1 + G)(N − 1): LookaheadDecodingConfig::calculateSpeculativeResourceTuple,
    as tensorrt_llm/llmapi/llm_args.py's calculate_speculative_resource calls it."""
    assert lookahead_max_draft_len(w, n, g) == expected


def _lookahead(**changes):
    data = {"name": "la", "target": {"checkpoint": "/models/Meta-Llama-3.1-8B-Instruct"},
            "speculation": {"method": "lookahead", "max_window_size": 7, "max_ngram_size": 7,
                            "max_verification_set_size": 7},
            "build": {"max_batch_size": 8, "max_input_len": 1024, "max_seq_len": 2048, "max_num_tokens": 4096}}
    data.update(changes)
    return parse_config(data)


def test_lookahead_engine_is_the_target_built_in_lookahead_mode(tmp_path):
    plan = make_plan(_lookahead(), trtllm_root=str(tmp_path))
    assert sorted(plan.engines) == ["baseline", "speculative"] and plan.max_draft_len == 83
    spec = plan.step("build-speculative").argv
    assert spec[spec.index("--speculative_decoding_mode") + 1] == "lookahead_decoding"
    assert spec[spec.index("--max_draft_len") + 1] == "83"
    assert spec[spec.index("--checkpoint_dir") + 1] == plan.step("build-baseline").argv[2]  # the target's checkpoint
    assert "--speculative_decoding_mode" not in plan.step("build-baseline").argv


def _errors(cfg):
    return errors_of(run_preflight(cfg, offline=True))


def test_lookahead_validates_on_the_engine_runtime_only():
    assert _errors(_lookahead()) == []
    refused = _errors(_lookahead(trtllm_runtime="llm_api"))
    assert any("lookahead is engine-only" in f.message and "supports_backend" in f.message for f in refused), refused
    old = _errors(_lookahead(trtllm_version="0.12.0"))
    assert any("lookahead decoding needs TensorRT-LLM ≥ 0.13" in f.message for f in old), old


def test_lookahead_reference_engine_gets_the_proposer_fields(tmp_path):
    cfg = parse_config({"name": "tiny-la", "backend": "reference", "hardware": "cpu",
                        "target": {"checkpoint": "builtin:tiny-target"},
                        "speculation": {"method": "lookahead", "max_window_size": 3}}, workdir=tmp_path)
    argv = make_plan(cfg).step("engine-speculative").argv
    assert argv[argv.index("--method") + 1] == "lookahead"
    assert argv[argv.index("--proposer-fields") + 1] == \
        '{"max_ngram_size":3,"max_verification_set_size":4,"max_window_size":3}'
    assert argv[argv.index("--max-draft-len") + 1] == str(lookahead_max_draft_len(3, 3, 4))


def _eagle1_cfg(num_layers: int):
    return parse_config({
        "name": "eagle1", "backend": "trtllm", "hardware": "h100-sxm-80gb",
        "target": {"checkpoint": "/models/Meta-Llama-3.1-8B-Instruct"},
        "speculation": {"method": "eagle", "head_dir": "/models/EAGLE-LLaMA3-Instruct-8B", "num_layers": num_layers},
        "build": {"max_batch_size": 8, "max_input_len": 1024, "max_seq_len": 2048},
    })


def test_eagle1_engine_holds_one_full_head_per_level():
    """Upstream's EAGLE-1 engine is num_eagle_layers EagleNets, each its own embedding, fc, layer and
    lm_head (tensorrt_llm/models/eagle/model.py; examples/eagle/convert_checkpoint.py copies the head
    into every eagle_nets.{i}); the memory estimate used to count one head with extra lm_heads only."""
    shape = known_shape("/models/Meta-Llama-3.1-8B-Instruct")
    h, v, layer = shape.hidden_size, shape.vocab_size, shape.layer_params()
    cfg = _eagle1_cfg(3)
    est = estimate_memory(cfg, get_profile("h100-sxm-80gb"), shape)
    row = next(r for r in est.rows if r.component == "EAGLE head")
    assert row.gib == pytest.approx(3 * (2 * h * h + h + layer + 2 * v * h) * 2 / GIB, rel=1e-9)


def test_forecast_prices_the_head_the_memory_estimate_counts():
    """One formula: a tree level's forward multiplies exactly one copy's weights but its embedding."""
    cfg = _eagle1_cfg(3)
    head = cfg.method_info.draft_head(cfg.speculation)
    shape = known_shape("/models/Meta-Llama-3.1-8B-Instruct")
    seen = []

    class Device:  # records the costs the proposer asks for (a boundary, not the roofline)
        def forward(self, cost, batch, tokens, context):
            seen.append((cost, tokens))
            return type("T", (), {"seconds": 1.0})()

    target = model_cost("target", shape, 2.0, 2.0, 2.0)
    ctx = StepContext(Device(), target, None, 2.0, shape.vocab_size, 4, 100, 2.0)
    plan = PLANS["eagle"](cfg.speculation)
    assert PROPOSER_COSTS["eagle"](ctx, plan) == len(plan.level_widths)
    per_copy = head.forward_params(shape.hidden_size, shape.vocab_size, shape.layer_params())
    for cost, _ in seen:
        assert cost.weight_bytes == pytest.approx(per_copy * 2.0, rel=1e-6)
    embed = shape.vocab_size * shape.hidden_size
    assert head.resident_params(shape.hidden_size, shape.vocab_size, shape.layer_params()) == 3 * (per_copy + embed)
