"""assignors."""
