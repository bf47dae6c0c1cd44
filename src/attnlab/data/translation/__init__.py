"""Parallel text for translation: reading sentence pairs, storing them as token arrays, and the data module."""
