"""``python -m pipeline`` runs the specdeploy CLI (same as the console script)."""

from pipeline.cli import main

if __name__ == "__main__":  # not when a spawned worker (demo training) imports it
    main()
