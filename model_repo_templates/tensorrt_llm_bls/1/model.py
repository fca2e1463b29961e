"""Triton Python model `tensorrt_llm_bls` rendered by specdeploy. The code lives in
`pipeline.triton_models.bls` (shared by CPU and GPU deployments); `specdeploy serve` puts the
project root on the stub's PYTHONPATH."""

from pipeline.triton_models.bls import TritonPythonModel  # noqa: F401
