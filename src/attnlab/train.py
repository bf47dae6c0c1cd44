"""`python -m attnlab.train`: the same as `attnlab-train` and the repository's train.py (see README.md)."""

from attnlab.cli.train import run

if __name__ == "__main__":
    run()
