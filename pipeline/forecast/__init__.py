"""Forecast before GPU time: expected TPOT of both arms, speedup per concurrency, crossover and
best draft length, from acceptance and a cost model (docs/forecast.md).

Modules: ``figures`` (GPU figures from the facts library's ``gpus.yaml``, engine figures from
data/engines.yaml), ``roofline`` (time of one forward), ``proposers`` (per-method drafting cost and verify width: a registry), ``acceptance`` (τ and the
acceptance sources), ``model`` (the forecast itself), ``cpu`` (the reference engine's calibrated
form), ``calibration_prompts`` (the deployment's prompts a calibration is timed on),
``machine_calibration`` (this machine's calibration for a config: made, stored, reused),
``published`` (published cases reproduced), ``render`` (text and plot).
"""
