"""models x arms x seeds: deploy/experiment.py."""
