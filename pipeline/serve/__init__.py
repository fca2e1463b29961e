"""Stage 5, serve: start, watch and stop ``tritonserver`` on the rendered repositories.

Reads ``engines/NAME/model_repo/<arm>/`` and the build manifest; writes the server log and pid
file under ``engines/NAME/logs/``. ``server`` starts and stops; ``command`` builds the command
line and environment; ``tritonserver_install`` finds the binary; ``cpu_pinning`` splits the CPUs
between server and engines; ``stale_server`` names servers an earlier run left behind.
"""
