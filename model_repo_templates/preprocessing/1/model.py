"""Triton Python model `preprocessing` rendered by specdeploy. The code lives in
`pipeline.triton_models.preprocessing` (shared by CPU and GPU deployments); `specdeploy serve` puts the
project root on the stub's PYTHONPATH."""

from pipeline.triton_models.preprocessing import TritonPythonModel  # noqa: F401
