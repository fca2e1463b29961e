"""Triton Python model `postprocessing` rendered by specdeploy. The code lives in
`pipeline.triton_models.postprocessing` (shared by CPU and GPU deployments); `specdeploy serve` puts the
project root on the stub's PYTHONPATH."""

from pipeline.triton_models.postprocessing import TritonPythonModel  # noqa: F401
