"""offloadd client package."""
