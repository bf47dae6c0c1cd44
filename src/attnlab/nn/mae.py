"""Masked autoencoder (He et al., 2021, "Masked Autoencoders Are Scalable Vision Learners").

A ViT encoder sees only the visible patches (25% at mask_ratio 0.75); a light decoder gets the encoded visible
patches plus a shared mask token at every masked position, and predicts the pixels of every patch; the loss is
the mean squared error on the masked patches only, against per-patch normalized pixels (norm_pix_loss).

The stages follow facebookresearch/mae models_mae.py: patchify, unpatchify, random_masking, forward_encoder,
forward_decoder, forward_loss. The encoder is built from timm's PatchEmbed and Block and its parameters are named
as in timm's VisionTransformer (patch_embed.*, cls_token, pos_embed, blocks.N.*, norm.*), so that its weights load
into a timm ViT for fine-tuning (attnlab.transfer.mae_vit.load_mae_encoder).
"""

from __future__ import annotations

from typing import Annotated

import torch
from annotated_types import Interval
from timm.layers import LayerNorm, PatchEmbed
from timm.models.vision_transformer import Block
from torch import nn

from attnlab.errors import SettingError
from attnlab.nn.registry import register_network
from attnlab.types import MultipleOf, PositiveFloat, PositiveInt

# embed_dim, depth, num_heads of ViT-Ti/S/B/L/H (timm's vit_{tiny,small,base,large,huge}_patch*)
SIZES = {
    "tiny": (192, 12, 3),
    "small": (384, 12, 6),
    "base": (768, 12, 12),
    "large": (1024, 24, 16),
    "huge": (1280, 32, 16),
}


def sincos_1d(dim: int, pos: torch.Tensor) -> torch.Tensor:
    omega = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64) / (dim / 2.0))  # (D/2,)
    out = pos.reshape(-1).double()[:, None] * omega[None]  # (M, D/2)
    return torch.cat([out.sin(), out.cos()], dim=1)  # (M, D)


def sincos_2d(dim: int, grid_size: int, cls_token: bool = True) -> torch.Tensor:
    """MAE's fixed 2D sin-cos positional embedding: half the channels encode one axis, half the other.
    (1 + G*G, D) with a zero row for the class token, or (G*G, D)."""
    coords = torch.arange(grid_size, dtype=torch.float64)
    gw, gh = torch.meshgrid(coords, coords, indexing="xy")  # as np.meshgrid(grid_w, grid_h): w first
    emb = torch.cat([sincos_1d(dim // 2, gw), sincos_1d(dim // 2, gh)], dim=1)  # (G*G, D)
    if cls_token:
        emb = torch.cat([torch.zeros(1, dim, dtype=emb.dtype), emb], dim=0)
    return emb.float()


class MaskedAutoencoderViT(nn.Module):
    def __init__(
        self,
        img_size: int = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        decoder_dim: int = 512,
        decoder_depth: int = 8,
        decoder_heads: int = 16,
        mask_ratio: float = 0.75,
        norm_pix_loss: bool = True,
    ):
        super().__init__()
        if img_size % patch_size:
            raise SettingError(f"patch_size={patch_size} does not divide img_size={img_size}: pick a patch size that "
                               f"does (e.g. patch_size={_divisor_near(img_size, patch_size)}).")
        for name, dim, heads in (("embed_dim", embed_dim, num_heads), ("decoder_dim", decoder_dim, decoder_heads)):
            if dim % 4 or dim % heads:
                raise SettingError(f"{name}={dim}: the 2D sin-cos positional embedding needs a multiple of 4, and "
                                   f"the attention a multiple of its {heads} heads. Pick such a width.")
        if not 0.0 <= mask_ratio < 1.0:
            raise SettingError(f"mask_ratio={mask_ratio}: the fraction of masked patches must be in [0, 1).")
        self.patch_size, self.in_chans = patch_size, in_chans
        self.mask_ratio, self.norm_pix_loss = mask_ratio, norm_pix_loss

        # ---- encoder: the parameter names of timm's VisionTransformer
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        num_patches = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, embed_dim), requires_grad=False)  # fixed
        self.blocks = nn.Sequential(*[
            Block(embed_dim, num_heads, mlp_ratio, qkv_bias=True, norm_layer=LayerNorm) for _ in range(depth)])
        self.norm = LayerNorm(embed_dim)

        # ---- decoder
        self.decoder_embed = nn.Linear(embed_dim, decoder_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_dim))
        self.decoder_pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, decoder_dim), requires_grad=False)
        self.decoder_blocks = nn.Sequential(*[
            Block(decoder_dim, decoder_heads, mlp_ratio, qkv_bias=True, norm_layer=LayerNorm)
            for _ in range(decoder_depth)])
        self.decoder_norm = LayerNorm(decoder_dim)
        self.decoder_pred = nn.Linear(decoder_dim, patch_size**2 * in_chans)

        self.initialize_weights()

    def initialize_weights(self) -> None:
        grid = self.patch_embed.grid_size[0]
        self.pos_embed.data.copy_(sincos_2d(self.pos_embed.shape[-1], grid)[None])
        self.decoder_pos_embed.data.copy_(sincos_2d(self.decoder_pos_embed.shape[-1], grid)[None])
        w = self.patch_embed.proj.weight.data  # as a linear layer, not a conv
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        nn.init.normal_(self.cls_token, std=0.02)
        nn.init.normal_(self.mask_token, std=0.02)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    @torch.jit.ignore
    def block_classes(self) -> set[type[nn.Module]]:
        """The repeated blocks (attnlab.protocols.BlockNetwork): FSDP units, activation checkpoints."""
        return {Block}  # timm's, in the encoder and the decoder

    def no_weight_decay(self) -> set[str]:
        return {"pos_embed", "cls_token", "mask_token", "decoder_pos_embed"}

    # ---- patches
    def patchify(self, imgs: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, L, p*p*C), patches in row-major order, pixels of a patch as (p, p, C)."""
        p, c = self.patch_size, imgs.shape[1]
        h, w = imgs.shape[2] // p, imgs.shape[3] // p
        x = imgs.reshape(imgs.shape[0], c, h, p, w, p)
        x = torch.einsum("nchpwq->nhwpqc", x)
        return x.reshape(imgs.shape[0], h * w, p * p * c)

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, p*p*C) -> (B, C, H, W); the inverse of patchify for square images."""
        p, c = self.patch_size, self.in_chans
        h = w = int(x.shape[1] ** 0.5)
        x = x.reshape(x.shape[0], h, w, p, p, c)
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(x.shape[0], c, h * p, w * p)

    # ---- masking
    def random_masking(self, x: torch.Tensor, mask_ratio: float, noise: torch.Tensor | None = None):
        """Keep a random (1 - mask_ratio) of the patches of each sample, by sorting per-sample noise.

        x: (B, L, D) -> kept (B, L_keep, D), mask (B, L) with 1 = masked (in the original order), ids_restore (B, L)
        (the argsort that puts the shuffled sequence back in order). `noise` (B, L) makes the mask reproducible.
        """
        B, L, D = x.shape
        len_keep = int(L * (1 - mask_ratio))
        if noise is None:
            noise = torch.rand(B, L, device=x.device)
        ids_shuffle = torch.argsort(noise, dim=1)  # ascending: the smallest noise values are kept
        ids_restore = torch.argsort(ids_shuffle, dim=1)
        ids_keep = ids_shuffle[:, :len_keep]
        x_kept = torch.gather(x, 1, ids_keep[..., None].expand(-1, -1, D))  # (B, L_keep, D)
        mask = torch.ones(B, L, device=x.device)
        mask[:, :len_keep] = 0
        mask = torch.gather(mask, 1, ids_restore)  # unshuffled: 1 where masked
        return x_kept, mask, ids_restore

    # ---- stages
    def forward_encoder(self, imgs: torch.Tensor, mask_ratio: float, noise: torch.Tensor | None = None):
        x = self.patch_embed(imgs)  # (B, L, D)
        x = x + self.pos_embed[:, 1:]
        x, mask, ids_restore = self.random_masking(x, mask_ratio, noise)  # (B, L_keep, D)
        cls = (self.cls_token + self.pos_embed[:, :1]).expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1)  # (B, 1 + L_keep, D)
        x = self.blocks(x)
        return self.norm(x), mask, ids_restore

    def forward_decoder(self, x: torch.Tensor, ids_restore: torch.Tensor) -> torch.Tensor:
        x = self.decoder_embed(x)  # (B, 1 + L_keep, Dd)
        B, L = ids_restore.shape
        mask_tokens = self.mask_token.expand(B, L + 1 - x.shape[1], -1)
        x_ = torch.cat([x[:, 1:], mask_tokens], dim=1)  # (B, L, Dd), in shuffled order
        x_ = torch.gather(x_, 1, ids_restore[..., None].expand(-1, -1, x.shape[2]))  # back in patch order
        x = torch.cat([x[:, :1], x_], dim=1)  # (B, 1 + L, Dd)
        x = x + self.decoder_pos_embed
        x = self.decoder_blocks(x)
        x = self.decoder_norm(x)
        return self.decoder_pred(x)[:, 1:]  # (B, L, p*p*C), the class token dropped

    def target(self, imgs: torch.Tensor) -> torch.Tensor:
        target = self.patchify(imgs)  # (B, L, p*p*C)
        if self.norm_pix_loss:  # each patch normalized by its own mean and variance
            mean, var = target.mean(-1, keepdim=True), target.var(-1, keepdim=True)
            target = (target - mean) / (var + 1.0e-6) ** 0.5
        return target

    def forward_loss(self, imgs: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Mean squared error per patch, averaged over the masked patches only."""
        loss = ((pred.float() - self.target(imgs).float()) ** 2).mean(-1)  # (B, L)
        return (loss * mask).sum() / mask.sum().clamp_min(1)

    def forward(self, imgs: torch.Tensor, mask_ratio: float | None = None, noise: torch.Tensor | None = None):
        """(B, C, H, W) -> loss, pred (B, L, p*p*C), mask (B, L) with 1 = masked."""
        latent, mask, ids_restore = self.forward_encoder(imgs, self.mask_ratio if mask_ratio is None else mask_ratio,
                                                         noise)
        pred = self.forward_decoder(latent, ids_restore)
        return self.forward_loss(imgs, pred, mask), pred, mask

    def reconstruct(self, imgs: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor):
        """Images for display: (masked input, reconstruction), each (B, C, H, W). The reconstruction shows the
        predicted pixels of the masked patches (un-normalized with the true patch statistics when norm_pix_loss)
        and the visible patches as they were."""
        patches = self.patchify(imgs)
        if self.norm_pix_loss:
            mean, var = patches.mean(-1, keepdim=True), patches.var(-1, keepdim=True)
            pred = pred * (var + 1.0e-6) ** 0.5 + mean
        m = mask[..., None]  # (B, L, 1)
        masked = self.unpatchify(patches * (1 - m))
        return masked, self.unpatchify(patches * (1 - m) + pred * m)


def _divisor_near(n: int, p: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: abs(d - p))


@register_network("mae_vit")
def mae_vit(size: str = "base", embed_dim: PositiveInt | None = None, depth: PositiveInt | None = None,
            num_heads: PositiveInt | None = None, img_size: Annotated[PositiveInt, MultipleOf("patch_size")] = 224,
            patch_size: PositiveInt = 16, in_chans: PositiveInt = 3, mlp_ratio: PositiveFloat = 4.0,
            decoder_dim: PositiveInt = 512, decoder_depth: PositiveInt = 8, decoder_heads: PositiveInt = 16,
            mask_ratio: Annotated[float, Interval(gt=0, lt=1)] = 0.75,
            norm_pix_loss: bool = True) -> MaskedAutoencoderViT:
    """An MAE whose encoder is ViT-<size>, or any width/depth/heads given explicitly (these win over size)."""
    if size not in SIZES:
        raise SettingError(f"size={size} is not a ViT size: use one of {', '.join(SIZES)} (or set embed_dim, depth "
                           "and num_heads directly).")
    d, n, h = SIZES[size]
    return MaskedAutoencoderViT(img_size, patch_size, in_chans, embed_dim or d, depth or n, num_heads or h, mlp_ratio,
                                decoder_dim, decoder_depth, decoder_heads, mask_ratio, norm_pix_loss)
