"""Stage 7, report: statistics, the GO/NO-GO gate and the rendered report of one run.

Reads a run directory written by the load test (``run.json``, ``runs.json``, ``raw/*.jsonl``);
writes ``report.json``, ``report.md`` and ``report.html`` into it (``compare.*`` for two runs).
``stats`` summarises the records, ``comparison`` compares the arms, ``gate`` decides, ``builder``
assembles and writes, ``view`` renders the pages.
"""
