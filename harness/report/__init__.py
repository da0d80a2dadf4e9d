"""Summaries, the grid picture, the un-quarantine verdict."""
