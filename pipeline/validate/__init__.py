"""Stage 1, validate: everything that can be known to fail before a build starts.

Reads the config (through ``pipeline.config``), the checkpoints it names (config.json, tokenizer
files, weight headers), the prompt set and the host (hardware profile, allowed CPUs). Writes
nothing: it returns findings that ``specdeploy validate`` prints and that ``run`` and ``build``
refuse on. ``preflight`` is the entry point; ``findings`` what a check reports; the other modules
are the checks. The model and hardware facts they read are the facts library's
(``pipeline.facts``), shared with every other stage.
"""
