"""Scenario files -> cells: schema, cells and expectations, goldens, selections, what this machine can run."""
