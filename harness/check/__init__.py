"""Pure judging, no processes: key patterns, comparison, logits criterion, expectations, ModelOpt rules per version."""
