"""Semantic segmentation data: image/mask pairs, joint transforms, and the public benchmarks."""
