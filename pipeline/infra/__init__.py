"""Infrastructure shared by the stages, with no knowledge of any stage: ``processes`` (children
that end with their owner, stopping trees), ``atomic`` (atomic file writes), ``provenance`` (git
SHA and package versions), ``readiness`` (server probes through tritonclient), ``trees`` (tree
choices shared by config, plan and render)."""
