"""streamkit."""
