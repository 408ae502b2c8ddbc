"""layout ops (filled in by their owner)."""
