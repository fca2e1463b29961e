"""Stage 2, plan: the exact build steps and GPU placement for a config.

Reads the validated config (and, for placement, ``nvidia-smi``); writes nothing itself: it
returns a ``BuildPlan`` (argv and env per step) that ``specdeploy plan`` prints and the build
stage runs. ``planner`` makes the steps; ``gpu_layout`` places the arms on GPUs.
"""
