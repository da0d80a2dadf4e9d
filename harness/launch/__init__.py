"""Controller side of one torchrun: command, watch, teardown, nodes, signals, failure classification, warm pools (any other child process run to a limit: harness/bounded.py)."""
