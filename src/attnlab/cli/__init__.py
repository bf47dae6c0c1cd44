"""Entry points (train, eval, predict) and the pieces they assemble a run from."""
