"""Stage 5, serve: start, watch and stop ``tritonserver`` on the rendered repositories.

Reads the rendered repositories and the build manifest; writes server logs and the state file
of a running deployment under ``runs/``. Also finds the tritonserver install, pins CPU cores and
names servers left over from an earlier run.
"""
