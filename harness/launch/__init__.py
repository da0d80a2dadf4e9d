"""Controller side of one torchrun: command, watch, teardown, nodes, signals, failure classification, warm pools; and bounded.py, any other child process run to a limit."""
