"""host ops (filled in by their owner)."""
