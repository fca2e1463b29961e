"""Stage 4, render: Triton model repositories from the build manifest.

Reads the build manifest and ``model_repo_templates/``; writes one model repository per arm
under ``model_repos/<name>/`` (config.pbtxt files, model.py stubs, the code they import).
"""
