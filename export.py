"""Export a checkpoint's network: `python export.py ckpt_path=... format=safetensors` (see README.md)."""

from attnlab.cli.export import run

if __name__ == "__main__":
    run()
