"""Predict with a checkpoint: `python predict.py ckpt_path=... ` (see README.md)."""

from attnlab.cli.predict import main

if __name__ == "__main__":
    main()
