"""Evaluate a checkpoint on its test split: `python eval.py ckpt_path=... ` (see README.md)."""

from attnlab.cli.eval import main

if __name__ == "__main__":
    main()
