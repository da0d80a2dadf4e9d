"""Golden checkpoints: manifests, metadata and storage checks, layouts, forecasts, repair."""
