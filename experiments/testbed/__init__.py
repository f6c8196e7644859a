"""Emulated devices and links for measured runs: deploy/testbed.py."""
