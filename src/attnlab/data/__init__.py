"""LightningDataModules. Each declares its `kind` (what tasks it feeds) and, once set up, its `info()`
(attnlab.data.info: what the model takes from it)."""
