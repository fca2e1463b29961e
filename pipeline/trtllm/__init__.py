"""TensorRT-LLM specifics of the engine path: per-version command builders (``commands``) and the
post-build validator of an engine's ``config.json`` (``engine_config``). Nothing here imports
TensorRT-LLM; commands are plain argv lists run by ``pipeline.build.builder``."""
