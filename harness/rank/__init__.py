"""Only code that runs inside torchrun: entry point, guard, stage bodies, probes, injections."""
