"""`python -m attnlab.export`: the same as `attnlab-export` and the repository's export.py (see README.md)."""

from attnlab.cli.export import run

if __name__ == "__main__":
    run()
