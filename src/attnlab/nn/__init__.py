"""Network building blocks and model definitions."""
