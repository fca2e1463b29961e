"""The report's pages: decision summary, tables, plots and their Jinja templates.

Reads the report data built by ``pipeline.report.builder`` (the content of ``report.json``), the analysis
and the raw runs (for plots); writes nothing itself — ``pipeline.report.builder`` writes the files.
Modules: ``rounding`` (the one rounding rule), ``model`` (accessors on the report data),
``summary`` (the verdict banner and findings), ``tables``, ``plots``, ``compare`` (two runs side
by side) and ``render`` (Jinja, templates under ``templates/``).
"""
