"""nn ops (filled in by their owner)."""
