"""Triton Python model `tensorrt_llm` rendered by specdeploy. The code lives in
`pipeline.triton_models.llm` (shared by CPU and GPU deployments); `specdeploy serve` puts the
project root on the stub's PYTHONPATH."""

from pipeline.triton_models.llm import TritonPythonModel  # noqa: F401
