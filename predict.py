"""Predict with a checkpoint: `python predict.py ckpt_path=... ` (see README.md)."""

from attnlab.cli.predict import run

if __name__ == "__main__":
    run()
