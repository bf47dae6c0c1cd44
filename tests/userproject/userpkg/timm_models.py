"""A network registered with timm: `extras.imports=[userpkg.timm_models] model.backbone=tiny_user_mlp`."""

from __future__ import annotations

from timm.models import register_model
from torch import nn


class TinyMLP(nn.Module):
    def __init__(self, num_classes: int = 10, in_chans: int = 3, img_size: int = 8, hidden: int = 64, **kwargs):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_chans * img_size * img_size, hidden), nn.GELU(),
                                 nn.Linear(hidden, num_classes))

    def forward(self, x):  # (B, C, H, W) -> (B, num_classes)
        return self.net(x)


@register_model
def tiny_user_mlp(pretrained: bool = False, **kwargs) -> TinyMLP:
    return TinyMLP(**kwargs)
