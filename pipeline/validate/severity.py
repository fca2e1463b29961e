"""The three severities of a preflight finding (imported by the findings and by the method modules,
which the config package loads before any validate module)."""

ERROR, WARNING, INFO = "error", "warning", "info"
