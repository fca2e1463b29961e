"""Stage 4, render: Triton model repositories from the build manifest.

Reads ``engines/NAME/manifest.json`` and ``model_repo_templates/``; writes one model repository
per arm, ``engines/NAME/model_repo/{baseline,speculative}/`` (config.pbtxt files, model.py stubs,
the project code they import) and the stamp ``<arm>.render.json`` beside each. ``renderer``
renders and swaps in; ``triton_rules`` checks what Triton would refuse; ``model_code`` copies
the code a Python model imports.
"""
