"""Stage 6, loadtest: drive the served arms with Locust and record every request.

Reads the config's ``loadtest`` section, the prompt set and the rendered deployment (its servers
started here, or endpoints the user gives); writes one run directory ``reports/NAME/RUN/``:
``run.json`` (provenance), ``runs.json`` (one entry per Locust run), raw request records
``raw/*.jsonl``, ``settings/``, ``metrics/`` and ``logs/``. ``runner`` is the entry point.
"""
