"""``python -m pipeline`` runs the specdeploy CLI (same as the console script)."""

from pipeline.cli import main

main()
