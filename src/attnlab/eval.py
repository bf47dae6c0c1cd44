"""`python -m attnlab.eval`: the same as `attnlab-eval` and the repository's eval.py (see README.md)."""

from attnlab.cli.eval import run

if __name__ == "__main__":
    run()
