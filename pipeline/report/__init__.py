"""Stage 7, report: statistics, the GO/NO-GO gate and the rendered report.

Reads a run directory written by the load test; writes ``analysis.json``, ``report.json`` and the
Markdown/HTML report (``view``) next to it. ``stats`` computes, ``gate`` decides, ``builder``
assembles and writes.
"""
