"""Typed artefacts: every file one stage writes and a later one reads, as a pydantic model with its
schema name and version (:mod:`pipeline.artefacts.base`). One module per family; ``ARTEFACTS``
names each for ``specdeploy schema <name>`` (imported lazily, so importing this package is cheap)."""

from __future__ import annotations

import importlib

# name → (module, class)
ARTEFACTS = {
    "engine": ("pipeline.artefacts.engine", "EngineDescriptor"),
    "manifest": ("pipeline.artefacts.manifest", "BuildManifest"),
    "deployment": ("pipeline.artefacts.deployment", "ArmDeployment"),
    "run": ("pipeline.artefacts.runs", "RunInfo"),
    "runs": ("pipeline.artefacts.runs", "RunResults"),
    "run-settings": ("pipeline.artefacts.runs", "RunSettings"),
    "record": ("pipeline.artefacts.records", "RawRecord"),
    "report": ("pipeline.artefacts.report", "Report"),
    "compare": ("pipeline.artefacts.report", "Comparison"),
    "schedule": ("pipeline.artefacts.schedule", "SpeculationSchedule"),
}


def artefact_model(name: str):
    module, cls = ARTEFACTS[name]
    return getattr(importlib.import_module(module), cls)
