"""One command of a build plan: what ``plan`` prints and ``build`` runs. Its own module so the
planners of both TensorRT-LLM runtimes (``pipeline.plan.planner``, ``pipeline.plan.llmapi``)
can make steps without importing each other. Reads and writes nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.trtllm.checkpoint_config import ExpectedCheckpoint
from pipeline.trtllm.engine_config import ExpectedEngine


@dataclass
class Step:
    """One command of the build. ``expect`` (trtllm builds only) is checked against the built
    engine's config.json before the output is moved into place."""

    name: str
    argv: list[str]
    inputs: list[str]
    outputs: list[str]
    env: dict[str, str] = field(default_factory=dict)
    kind: str = ""  # resolve | quantize | convert | build | engine
    expect: ExpectedEngine | None = None
    expect_checkpoint: ExpectedCheckpoint | None = None  # the TRT-LLM checkpoint trtllm-build will read
    scratch_dirs: list[str] = field(default_factory=list)  # created before the step (timing caches)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "argv": list(self.argv), "inputs": list(self.inputs), "outputs": list(self.outputs)}
