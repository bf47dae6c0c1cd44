"""Masked-autoencoder pretraining on images (labels ignored), and loading its encoder into a timm ViT.

`model=mae` trains `attnlab.nn.mae.MaskedAutoencoderViT`; `model=vit model.init_from=<its checkpoint>` fine-tunes
(or, with `model.freeze_backbone=true`, linearly probes) the encoder as a timm VisionTransformer.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import torch
from torchmetrics import MeanMetric

from attnlab.nn.registry import create_network
from attnlab.tasks.base import BaseTask
from attnlab.types import MultipleOf, PositiveInt
from attnlab.utils.media import denormalize, panel_grid, save_media

log = logging.getLogger("attnlab")


class MAEPretrainer(BaseTask):
    """Logs `train/loss`, `val/loss`, `val/loss_best` (and `test/loss`): the pixel MSE on masked patches.

    Validation and test mask each batch with the same seeded noise every epoch, so `val/loss` is comparable across
    epochs. Each validation epoch writes an original | masked input | reconstruction grid of the first
    `media_images` validation images to `<run dir>/media/` (and to W&B when it logs).
    """

    def __init__(
        self,
        net: str = "mae_vit",
        img_size: Annotated[PositiveInt, MultipleOf("patch_size")] = 224,
        in_chans: PositiveInt = 3,
        media_images: int = 8,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        class_names: list[str] | None = None,  # given by image data; the labels are not used
        **settings: Any,
    ):
        """`net`: the network (`mae_vit`: a ViT-`size` encoder and a light decoder); its settings are the other
        keywords it takes (`size`, `patch_size`, `embed_dim`, `decoder_dim`, `mask_ratio`, `norm_pix_loss`, ...)."""
        network, base = create_network(net, settings | {"img_size": img_size, "in_chans": in_chans})
        super().__init__(**({"monitor": "val/loss", "monitor_mode": "min"} | base))
        self.save_hyperparameters(ignore=["class_names"])
        self.net = network
        self.mean = list(mean or [0.5] * in_chans)
        self.std = list(std or [0.5] * in_chans)
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()
        self._media: tuple[torch.Tensor, ...] | None = None

    def forward(self, x: torch.Tensor, noise: torch.Tensor | None = None):
        return self.run_net(x, noise=noise)  # loss, pred (B, L, p*p*C), mask (B, L)

    def training_loss(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)[0]  # masking, encoder, decoder and the loss on the masked patches

    def training_step(self, batch, batch_idx):
        x = batch[0]  # (B, C, H, W); labels ignored
        loss = self.run_training_loss(x)
        self.log_train_loss(loss, x.shape[0], epoch_mean=True)
        return loss

    def fixed_noise(self, n: int, batch_idx: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(batch_idx)
        return torch.rand(n, self.net.patch_embed.num_patches, generator=gen).to(self.device)  # (B, L)

    def _eval_step(self, batch, batch_idx: int, metric: MeanMetric):
        x = batch[0]
        loss, pred, mask = self(x, noise=self.fixed_noise(x.shape[0], batch_idx))
        metric.update(loss, x.shape[0])
        return x, pred, mask

    def validation_step(self, batch, batch_idx):
        x, pred, mask = self._eval_step(batch, batch_idx, self.val_loss)
        if batch_idx == 0 and self.hparams.media_images:
            n = self.hparams.media_images
            self._media = (x[:n].detach(), pred[:n].detach(), mask[:n].detach())

    def on_validation_epoch_end(self):
        loss = self.val_loss.compute()
        self.val_loss.reset()
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)
        self.log_best(loss)
        if not self.trainer.sanity_checking and self.trainer.is_global_zero and self._media is not None:
            self._save_media()
        self._media = None

    def test_step(self, batch, batch_idx):
        self._eval_step(batch, batch_idx, self.test_loss)

    def on_test_epoch_end(self):
        self.log("test/loss", self.test_loss.compute(), sync_dist=True)
        self.test_loss.reset()

    def reconstruction_grid(self, x: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor):
        """One row per image: original | masked input | reconstruction, as a uint8 (H', W', 3) array."""
        masked, recon = self.net.reconstruct(x.float(), pred.float(), mask.float())
        rows = [[denormalize(im, self.mean, self.std) for im in triple] for triple in zip(x, masked, recon)]
        return panel_grid(rows, height=max(96, x.shape[-1]))

    def _save_media(self) -> Path | None:
        return save_media(self.trainer, "val/reconstructions", self.reconstruction_grid(*self._media),
                          "original | masked input | reconstruction (predicted masked patches + the visible ones)")

    def flops_per_sample(self) -> float | None:
        from attnlab.utils.flops import training_flops_per_sample

        h = self.hparams
        return training_flops_per_sample(self.net, (h.in_chans, h.img_size, h.img_size))
