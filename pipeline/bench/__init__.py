"""The reference engine's micro-benchmark (``specdeploy bench``), outside the engine package.

Reads the config and the demo models; writes a benchmark result JSON where it is told to.
"""
