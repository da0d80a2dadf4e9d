"""Controller side of one torchrun: command, watch, teardown, nodes, signals, failure classification, warm pools."""
