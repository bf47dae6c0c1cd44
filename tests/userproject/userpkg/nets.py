"""Networks of the user's own: any nn.Module class or factory taking num_classes and in_chans."""

from __future__ import annotations

from torch import nn


class TinyCNN(nn.Module):
    """Two 3x3 convolutions and a linear head: model.backbone=userpkg.nets.TinyCNN."""

    def __init__(self, num_classes: int, in_chans: int = 3, width: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_chans, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.head = nn.Linear(2 * width, num_classes)

    def get_classifier(self) -> nn.Module:  # timm's hook: model.freeze_backbone=true trains only this
        return self.head

    def forward(self, x):  # (B, C, H, W) -> (B, num_classes)
        return self.head(self.features(x))
