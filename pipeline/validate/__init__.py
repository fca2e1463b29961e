"""Stage 1, validate: the checks that run before anything is built.

Reads the YAML config (through ``pipeline.config``) and the checkpoints it names (config.json,
tokenizer files, weight headers, remote code); probes the host (GPUs, RAM, installed tools).
Writes nothing: it returns findings that ``specdeploy validate`` prints and that gate every later
stage. ``preflight`` is the entry point; the other modules are its checks.
"""
