"""LightningModules, one per task. Each takes its network's config (not a built network) so a checkpoint
alone is enough to rebuild it: `Task.load_from_checkpoint(path)`."""
