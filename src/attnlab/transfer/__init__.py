"""Weights from one run into another task's network (`model.init_from=`): the MAE encoder into a timm ViT."""
