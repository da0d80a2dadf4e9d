"""Controller side of one torchrun: launch and teardown, failure classification, GPU pool."""
