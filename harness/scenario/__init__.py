"""Scenario files -> cells, tiers and what this machine can run, the quarantine file."""
