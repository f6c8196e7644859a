"""The compute/time frontier: deploy/frontier.py."""
