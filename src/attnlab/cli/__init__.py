"""Entry points (train, eval, predict, export) and the pieces they assemble a run from."""
