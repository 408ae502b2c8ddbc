"""reduce ops (filled in by their owner)."""
