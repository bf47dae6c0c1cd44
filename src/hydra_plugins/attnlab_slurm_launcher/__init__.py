"""attnlab's SLURM launcher for Hydra: Hydra's submitit launcher, with a sweep driver that follows its jobs
(slurm_launcher.py)."""
