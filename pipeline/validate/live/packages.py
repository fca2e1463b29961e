"""The Python packages our served models import (pre/post-processing, BLS, the llmapi helpers) and
torch, at the versions installed in the interpreter that runs TensorRT-LLM, against everything that
constrains them there.

Reads, in that interpreter (:mod:`.probe`; ``importlib.metadata`` only, nothing imported): the
installed versions, the ``Requires-Dist`` of ``tensorrt_llm`` and of everything it requires
(transitively), the ``Requires-Dist`` and ``Provides-Extra`` of ``specdeploy`` when it is installed
there, and the interpreter's marker environment. The rule for each package is the intersection of

- ``tensorrt_llm``'s own pins (markers evaluated for that interpreter),
- ``specdeploy``'s base requirements and those of each extra installed there. pip records no
  extras, so an extra counts as installed when every distribution only it brings is present;
  a distribution TensorRT-LLM's requirements already bring proves nothing (the image's
  transformers says nothing about ``.[serving]``). On a GPU host that is ``gpu-host``
  (docs/gpu-runbook.md), whose tritonclient the image lacks; ``serving`` adds nvidia-pytriton,
- what the served models need (:data:`pipeline.validate.served_packages.SERVED_MODEL_NEEDS`).

Writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from pipeline.validate.live.probe import MARKER, python_executable, python_source, run_probe
from pipeline.validate.live.result import LiveCheck, failed, passed
from pipeline.validate.served_packages import SERVED_MODEL_NEEDS

WATCHED = ("transformers", "tokenizers", "numpy", "torch", "sentencepiece", "protobuf")
SERVED_MODELS = "served models"

_CODE = f"""
import json, os, platform, re, sys
from importlib import metadata
watched = json.load(sys.stdin)
NAME = re.compile(r"^\\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
def requires(name):
    try:
        return list(metadata.requires(name) or [])
    except metadata.PackageNotFoundError:
        return None
trt = requires("tensorrt_llm")
closure, todo = set(), [r for r in (trt or []) if "extra ==" not in r and "extra==" not in r]
while todo:
    match = NAME.match(todo.pop())
    if not match or norm(match.group(1)) in closure:
        continue
    closure.add(norm(match.group(1)))
    todo += [r for r in (requires(match.group(1)) or []) if "extra ==" not in r and "extra==" not in r]
spec = requires("specdeploy")
try:
    extras = metadata.metadata("specdeploy").get_all("Provides-Extra") or []
except metadata.PackageNotFoundError:
    extras = []
names = set(watched) | {{m.group(1) for m in (NAME.match(r) for r in spec or []) if m}}
env = {{"implementation_name": sys.implementation.name, "implementation_version": platform.python_version(),
       "os_name": os.name, "platform_machine": platform.machine(), "platform_release": platform.release(),
       "platform_system": platform.system(), "platform_version": platform.version(),
       "python_full_version": platform.python_version(), "platform_python_implementation": platform.python_implementation(),
       "python_version": ".".join(platform.python_version_tuple()[:2]), "sys_platform": sys.platform}}
print({MARKER!r} + json.dumps({{"python": sys.executable, "env": env, "versions": {{n: version(n) for n in sorted(names)}},
                              "tensorrt_llm": [version("tensorrt_llm"), trt], "specdeploy": [version("specdeploy"), spec],
                              "extras": extras, "closure": sorted(closure)}}))
"""


@dataclass(frozen=True)
class PackageState:
    name: str
    installed: str | None
    requirements: tuple[tuple[str, str], ...]  # (who requires it, specifier)

    def violations(self) -> list[tuple[str, str]]:
        """(who, specifier) of each requirement the installed version breaks."""
        if self.installed is None:
            return [(who, spec) for who, spec in self.requirements]
        try:
            version = Version(self.installed)
        except InvalidVersion:
            return []
        return [(who, spec) for who, spec in self.requirements
                if spec and not Requirement(f"{self.name}{spec}").specifier.contains(version, prereleases=True)]


@dataclass
class Environment:
    """What the probe read in the TensorRT-LLM interpreter."""

    python: str
    marker_env: dict[str, str]
    versions: dict[str, str | None]
    trtllm: tuple[str | None, list[str] | None]
    specdeploy: tuple[str | None, list[str] | None]
    extras: list[str]
    closure: set[str]

    def installed(self, name: str) -> bool:
        wanted = canonicalize_name(name)
        return any(canonicalize_name(n) == wanted and v for n, v in self.versions.items())


def _requirements(lines: list[str] | None) -> list[Requirement]:
    out = []
    for line in lines or []:
        try:
            out.append(Requirement(line))
        except InvalidRequirement:
            continue  # a malformed line constrains nothing we could check
    return out


def _applies(req: Requirement, env: dict[str, str], extra: str) -> bool:
    if req.marker is None:
        return True
    try:
        return req.marker.evaluate({**env, "extra": extra})
    except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
        return False


def installed_extras(env: Environment) -> list[str]:
    """The specdeploy extras whose own distributions (those TensorRT-LLM's requirements do not
    already bring) are all installed; an extra with none of its own is not counted. An extra made
    of other extras (``cpu = ["specdeploy[reference,serving,loadtest]"]``) counts when all of them do."""
    reqs = _requirements(env.specdeploy[1])

    def members(extra: str) -> list[Requirement]:
        return [r for r in reqs if r.marker is not None and _applies(r, env.marker_env, extra)
                and not _applies(r, env.marker_env, "")]

    def counted(extra: str, seen: frozenset[str] = frozenset()) -> bool:
        own, nested = set(), []
        for req in members(extra):
            if canonicalize_name(req.name) == "specdeploy":
                nested += [e for e in req.extras if e not in seen]
            else:
                own.add(canonicalize_name(req.name))
        own -= env.closure | {"tensorrt-llm"}
        if not own and not nested:
            return False
        return all(env.installed(n) for n in own) and all(counted(e, seen | {extra}) for e in nested)

    return [extra for extra in env.extras if counted(extra)]


def package_states(env: Environment) -> list[PackageState]:
    wanted: dict[str, list[tuple[str, str]]] = {name: [] for name in WATCHED}
    trt_version, trt_lines = env.trtllm
    for req in _requirements(trt_lines):
        name = canonicalize_name(req.name)
        if name in wanted and _applies(req, env.marker_env, ""):
            wanted[name].append((f"tensorrt_llm {trt_version}", str(req.specifier)))
    extras = installed_extras(env)
    for req in _requirements(env.specdeploy[1]):
        name = canonicalize_name(req.name)
        if name not in wanted:
            continue
        if _applies(req, env.marker_env, "") and (req.marker is None or "extra" not in str(req.marker)):
            wanted[name].append(("specdeploy", str(req.specifier)))
            continue
        for extra in extras:
            if _applies(req, env.marker_env, extra) and not _applies(req, env.marker_env, ""):
                wanted[name].append((f"specdeploy[{extra}]", str(req.specifier)))
    for name, (spec, _) in SERVED_MODEL_NEEDS.items():
        if name in wanted:
            wanted[name].append((SERVED_MODELS, spec))
    return [PackageState(name, env.versions.get(name), tuple(reqs)) for name, reqs in wanted.items()]


def read_environment() -> tuple[Environment | None, str]:
    data, problem = run_probe(_CODE, list(WATCHED))
    if data is None:
        return None, problem
    return Environment(python_executable(), data["env"], data["versions"], tuple(data["tensorrt_llm"]),
                       tuple(data["specdeploy"]), data["extras"], set(data["closure"])), ""


def _fix(state: PackageState, broken: list[tuple[str, str]], env: Environment) -> str:
    trt = [(who, spec) for who, spec in broken if who.startswith("tensorrt_llm")]
    extras = [(who, spec) for who, spec in broken if who.startswith("specdeploy[")]
    trt_pin = next((spec for who, spec in state.requirements if who.startswith("tensorrt_llm")), "")
    if trt:
        return (f"{env.python} -m pip install '{state.name}{trt_pin}' (what tensorrt_llm pins: something replaced the "
                "image's version); install specdeploy there with .[gpu-host], which leaves TensorRT-LLM's packages alone")
    if extras and trt_pin:
        return (f"{extras[0][0]} wants {state.name}{extras[0][1]}, which tensorrt_llm's pin {trt_pin} excludes: that "
                "extra is not for the TensorRT-LLM interpreter; install .[gpu-host] there (docs/gpu-runbook.md §1) "
                "and uninstall what only the other extra brought")
    who, spec = broken[0]
    return f"{env.python} -m pip install '{state.name}{spec}' ({who} needs it)"


def check_packages(image: str = "the TensorRT-LLM image") -> list[LiveCheck]:
    env, problem = read_environment()
    if env is None:
        return [failed("packages", "readable package metadata", f"interpreter: {python_source()}",
                       f"{python_executable()}: {problem}", "set SPECDEPLOY_TRTLLM_PYTHON to the interpreter that "
                       f"runs TensorRT-LLM (in {image}: python3 on PATH)")]
    extras = installed_extras(env)
    spec_version = env.specdeploy[0]
    who = (f"specdeploy[{','.join(extras)}]" if extras else "specdeploy (no extra counted)") if spec_version \
        else "no specdeploy there"
    source = (f"metadata in {env.python}: tensorrt_llm {env.trtllm[0] or 'absent'}, {who}; the served models' needs")
    out = []
    for state in package_states(env):
        expected = "; ".join(f"{who}: {spec or 'any'}" for who, spec in state.requirements) or "not required"
        found = state.installed or "not installed"
        broken = state.violations() if state.requirements else []
        if state.installed is None and not any(spec or who == SERVED_MODELS for who, spec in state.requirements):
            broken = []
        if broken:
            out.append(failed(f"package {state.name}", expected, source, found, _fix(state, broken, env)))
        else:
            out.append(passed(f"package {state.name}", expected, source, found))
    return out
