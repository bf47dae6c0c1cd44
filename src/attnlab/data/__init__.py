"""LightningDataModules. Each declares its `kind` (what tasks it feeds) and its `meta` (what flows into the model)."""
