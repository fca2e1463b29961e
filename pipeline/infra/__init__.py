"""Small infrastructure every stage shares: atomic writes, provenance, readiness probes, tree choices."""
