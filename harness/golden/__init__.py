"""Golden checkpoints: manifests and inspection."""
