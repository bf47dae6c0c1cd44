"""Evaluate a checkpoint on its test split: `python eval.py ckpt_path=... ` (see README.md)."""

from attnlab.cli.eval import run

if __name__ == "__main__":
    run()
