"""The facts library: what is true of models and hardware whatever stage asks, beneath the stages.

Reads the static tables it ships (``data/gpus.yaml``, the known model shapes) and, when asked, a
checkpoint's ``config.json``; writes nothing and imports no stage. ``hardware`` (the hardware
profiles: compute capability, memory, bandwidth, formats), ``model_shapes`` (layers, heads,
vocabulary of a model), ``memory_fit`` (the memory per GPU rank a deployment needs). Validate,
plan, serve and forecast read them alike; the checks that turn them into findings stay in
``pipeline.validate``.
"""
