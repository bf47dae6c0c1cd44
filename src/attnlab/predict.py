"""`python -m attnlab.predict`: the same as `attnlab-predict` and the repository's predict.py (see README.md)."""

from attnlab.cli.predict import run

if __name__ == "__main__":
    run()
