"""Stage 3, build: run the plan's steps and write engines plus the build manifest.

Reads the ``BuildPlan`` from ``pipeline.plan.planner`` and the checkpoints; writes the engine directories
under ``engines/<name>/`` and ``engines/<name>/manifest.json``. ``builder`` runs and records the
steps; ``reference_step`` is the step the CPU reference engine uses in place of ``trtllm-build``.
"""
