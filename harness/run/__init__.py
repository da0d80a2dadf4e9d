"""A cell, the cell loop, results files, repro, the version matrix."""
