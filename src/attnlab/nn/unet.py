"""The U-Net of Ronneberger et al. (2015): a contracting path of double 3x3 convolutions and 2x2 max pooling, an
expanding path of 2x2 transposed convolutions, and skip connections joining the two at each resolution.

Unlike the paper, the convolutions are padded, so the output has the input's height and width; an odd size is
handled by padding the upsampled map to its skip connection's size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DoubleConv(nn.Sequential):
    """(conv 3x3 -> [BatchNorm] -> ReLU) x 2."""

    def __init__(self, c_in: int, c_out: int, batch_norm: bool = True, dropout: float = 0.0):
        layers: list[nn.Module] = []
        for c in (c_in, c_out):
            layers.append(nn.Conv2d(c, c_out, 3, padding=1, bias=not batch_norm))
            if batch_norm:
                layers.append(nn.BatchNorm2d(c_out))
            layers.append(nn.ReLU(inplace=True))
        if dropout:
            layers.append(nn.Dropout2d(dropout))
        super().__init__(*layers)


class Up(nn.Module):
    """Transposed convolution halving the channels, concatenation with the skip, double conv."""

    def __init__(self, c_in: int, c_out: int, batch_norm: bool = True):
        super().__init__()
        self.up = nn.ConvTranspose2d(c_in, c_out, kernel_size=2, stride=2)
        self.conv = DoubleConv(2 * c_out, c_out, batch_norm)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        x = self.up(x)  # (B, c_out, 2h, 2w)
        dh, dw = skip.shape[-2] - x.shape[-2], skip.shape[-1] - x.shape[-1]
        if dh or dw:  # the skip had an odd size: pad to it
            x = F.pad(x, (dw // 2, dw - dw // 2, dh // 2, dh - dh // 2))
        return self.conv(torch.cat([skip, x], dim=1))  # (B, 2 c_out, H, W) -> (B, c_out, H, W)


class UNet(nn.Module):
    """`depth` poolings; the channels double at each level from `base_channels` (the paper: 64 and 4).

    (B, in_channels, H, W) -> (B, num_classes, H, W) logits, for any H, W >= 2**depth.
    """

    input_multiple, fixed_input_size = 1, False  # any input size (see nn/factory.encoder_decoder)

    def __init__(self, in_channels: int = 1, num_classes: int = 2, base_channels: int = 64, depth: int = 4,
                 batch_norm: bool = True, dropout: float = 0.0):
        super().__init__()
        widths = [base_channels * 2**i for i in range(depth + 1)]  # e.g. 64, 128, 256, 512, 1024
        self.depth = depth
        self.stem = DoubleConv(in_channels, widths[0], batch_norm)
        self.down = nn.ModuleList(DoubleConv(widths[i], widths[i + 1], batch_norm,
                                             dropout if i == depth - 1 else 0.0) for i in range(depth))
        self.up = nn.ModuleList(Up(widths[i + 1], widths[i], batch_norm) for i in reversed(range(depth)))
        self.head = nn.Conv2d(widths[0], num_classes, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if min(x.shape[-2:]) < 2**self.depth:
            raise ValueError(f"U-Net of depth {self.depth} needs images of at least {2**self.depth} px, "
                             f"got {tuple(x.shape[-2:])}")
        skips = [self.stem(x)]  # (B, C, H, W)
        for block in self.down:
            skips.append(block(F.max_pool2d(skips[-1], 2)))  # (B, 2C, H/2, W/2), ... (B, 2^d C, H/2^d, W/2^d)
        x = skips.pop()
        for block in self.up:
            x = block(x, skips.pop())  # back up one level: (B, C_level, H_level, W_level)
        return self.head(x)  # (B, num_classes, H, W)

