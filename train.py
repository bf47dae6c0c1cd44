"""Train a model: `python train.py model=vit data=cifar10 trainer=gpu` (see README.md)."""

from attnlab.cli.train import run

if __name__ == "__main__":
    run()
