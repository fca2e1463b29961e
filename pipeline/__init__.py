"""specdeploy: take a target LLM and a draft to a measured speculative-decoding deployment on
Triton + TensorRT-LLM (GPU) or the CPU reference engine, and decide from evidence whether to
roll it out. The CLI lives in ``pipeline.cli``; each stage is a module of this package."""

__version__ = "0.1.0"
