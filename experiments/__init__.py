"""localpar's experiment runner: sweeps of real training runs, their cache and their reports.

Modules:
  common    errors, progress lines, JSON files, the `localpar data` figures, CSV, result
            sections of a Markdown file
  stats     means, Student's t intervals, medians, bootstrap intervals
  plots     gnuplot SVGs
  jobs      job files through protobuf's text format: parsing, canonical hashes, variants
  cache     the run cache: one JSON-lines file per sweep, checked against configurations
  specfile  turning a JSON spec into dataclasses, naming the field that is wrong
  cli       the command line both front ends share
  matrix/   models x arms x seeds (deploy/experiment.py)
  frontier/ the compute/time frontier (deploy/frontier.py)

Run it with Debian's /usr/bin/python3, which has python3-protobuf.
"""
