"""Stage 5, serve: start, watch and stop ``tritonserver`` on the rendered repositories.

Reads ``engines/NAME/model_repo/<arm>/`` and the build manifest; writes the server log and pid
file under ``engines/NAME/logs/``. ``server`` starts and stops; ``command`` builds the command
line and environment; ``tritonserver_install`` finds the binary (the split of the CPUs between
server and engines is :mod:`pipeline.infra.cpu_pinning`, a host fact the CPU engine reads too); ``stale_server`` names servers an earlier run left behind.
"""
