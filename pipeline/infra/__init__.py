"""Infrastructure shared by the stages, with no knowledge of any stage: ``processes`` (children
that end with their owner, stopping trees), ``atomic`` (atomic file writes), ``provenance`` (git
SHA and package versions), ``readiness`` (server probes through tritonclient), ``trees`` (tree
choices shared by config, plan and render), ``cpu_pinning`` (the split of this host's CPUs between
the server and the CPU engines' decode threads, read by serve, the load test and the engine itself)."""
