"""Runnable streamkit examples."""
