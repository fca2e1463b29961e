"""Stage 6, loadtest: drive the served arms with Locust and record every request.

Reads the config's load-test section, the prompt sets and a running deployment (started here
if needed); writes one run directory under ``runs/<name>/``: the run settings, raw request
records per arm and concurrency, worker and server samples.
"""
