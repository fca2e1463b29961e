"""The CPU fast path of the reference engine, behind ``reference.fast_paths`` (default on):
faster kernels for the maths of :mod:`pipeline.reference.modeling`, never other maths.

- :mod:`~pipeline.reference.fast.kernels` — the small ops as TorchScript functions;
- :mod:`~pipeline.reference.fast.linear` — projections through the cheapest kernel per row
  count, and int8 packing for draft-side weights;
- :mod:`~pipeline.reference.fast.lean` — fused one-row drafting steps (draft model, EAGLE head);
- :mod:`~pipeline.reference.fast.models` — the model subclasses that use them,
  :data:`~pipeline.reference.fast.models.FAST_MODELS`.

With the switch off the engine loads :data:`pipeline.reference.modeling.PLAIN_MODELS`; the tests
compare the two (bit for bit where the kernels allow it, to rounding elsewhere, and the engine's
output in both). Reads and writes nothing.
"""
