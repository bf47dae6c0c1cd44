"""Semantic segmentation: a U-Net, or a timm backbone under a segmentation head (UPerNet, FPN, U-Net decoder, ...)
from segmentation-models-pytorch. Cross-entropy (+ optional dice) with an ignored label; mIoU and pixel accuracy."""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassConfusionMatrix

from attnlab.errors import UserError
from attnlab.nn.registry import create_network
from attnlab.tasks.base import BaseTask
from attnlab.tasks.seg_metrics import RandError
from attnlab.tasks.seg_weights import border_weights, check_border_weight
from attnlab.utils.media import denormalize, log_table, save_media
from attnlab.tasks.seg_media import overlay_grid

log = logging.getLogger("attnlab")

ARCHS = ("unet", "encoder_decoder")
# test-time augmentation: the flips (dims of a (B, C, H, W) tensor) whose predictions are averaged
TTA_FLIPS = {"none": [()], "hflip": [(), (-1,)], "flips": [(), (-1,), (-2,), (-2, -1)]}
# parameter names timm's no_weight_decay() hooks list (Swin, ViT, ConvNeXt-style backbones)
NO_DECAY_LEAVES = {"relative_position_bias_table", "absolute_pos_embed", "pos_embed", "cls_token", "dist_token"}
# Lightning says so each fit where the model's on_before_batch_transfer (the border weights) is the one it calls
warnings.filterwarnings("ignore", message="You have overridden `on_before_batch_transfer` in `LightningModule` but "
                        "have passed in a `LightningDataModule`")


# ---- inference on images of any size

def _starts(length: int, window: int, stride: int) -> list[int]:
    starts = list(range(0, length - window + 1, stride))
    return starts if starts[-1] == length - window else starts + [length - window]


def sliding_window(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, window: int, overlap: float = 1 / 3,
                   max_batch: int = 8) -> torch.Tensor:
    """Logits of (B, C, H, W) images from window x window tiles overlapping by `overlap`, averaged where they
    overlap. Images smaller than a window are padded (bottom/right) and the padding is cut off again.
    -> (B, num_classes, H, W)."""
    b, _, h, w = x.shape
    xp = F.pad(x, (0, max(0, window - w), 0, max(0, window - h)))
    hp, wp = xp.shape[-2:]
    stride = max(1, int(round(window * (1 - overlap))))
    boxes = [(top, left) for top in _starts(hp, window, stride) for left in _starts(wp, window, stride)]
    out = count = None
    for i in range(0, len(boxes), max(1, max_batch // b)):
        chunk = boxes[i:i + max(1, max_batch // b)]
        # (len(chunk) B, C, win, win)
        tiles = torch.cat([xp[..., top:top + window, left:left + window] for top, left in chunk])
        logits = fn(tiles).float()  # (len(chunk) B, K, win, win)
        if out is None:
            out = logits.new_zeros(b, logits.shape[1], hp, wp)
            count = logits.new_zeros(1, 1, hp, wp)
        for j, (top, left) in enumerate(chunk):
            out[..., top:top + window, left:left + window] += logits[j * b:(j + 1) * b]
            count[..., top:top + window, left:left + window] += 1
    return (out / count)[..., :h, :w]


def pad_forward(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, multiple: int) -> torch.Tensor:
    """One forward of the whole image, padded to a multiple of `multiple` and cut back. -> (B, K, H, W)."""
    h, w = x.shape[-2:]
    ph, pw = (-h) % multiple, (-w) % multiple
    return fn(F.pad(x, (0, pw, 0, ph)) if ph or pw else x)[..., :h, :w]


# ---- metrics

def iou_from_confusion(cm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Confusion matrix (rows truth, columns prediction) -> (per-class IoU with NaN for classes absent from both
    truth and prediction, mIoU over the present classes, pixel accuracy)."""
    cm = cm.double()
    tp = cm.diag()
    union = cm.sum(0) + cm.sum(1) - tp
    iou = torch.where(union > 0, tp / union.clamp_min(1), torch.full_like(tp, float("nan")))
    miou = iou.nanmean() if (union > 0).any() else torch.tensor(0.0, dtype=torch.float64)
    return iou.float(), miou.float(), (tp.sum() / cm.sum().clamp_min(1)).float()


class Segmenter(BaseTask):
    """Per-pixel classifier. Logs `train/loss`, `val/loss`, `val/miou`, `val/pixel_acc`, `val/miou_best`, and at test
    `test/miou`, `test/pixel_acc` and `test/iou/<class>` (the per-class table is also printed).

    Evaluation images larger than the training crop (`img_size`) are segmented by a sliding window
    (`inference: slide`, tiles overlapping by `window_overlap`) or in one forward (`inference: whole`, fully
    convolutional networks only). `tta`: test-time augmentation at validation, test and prediction: the class
    probabilities of the image and its horizontal flip (`hflip`), or of its horizontal, vertical and both flips
    (`flips`), each flipped back and averaged. Each validation epoch writes an image | truth | prediction grid of the
    first `media_images` validation images to `<run dir>/media/` (and to W&B when it logs).
    """

    def __init__(
        self,
        net: str = "unet",
        num_classes: int = 2,
        in_chans: int = 3,
        img_size: int = 256,
        dice_weight: float = 0.0,
        ignore_index: int = 255,
        inference: str = "slide",
        window_overlap: float = 1 / 3,
        tta: Literal["none", "hflip", "flips"] = "none",
        media_images: int = 4,
        class_names: list[str] | None = None,
        palette: list[list[int]] | None = None,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        rand_error_class: int | str | None = None,
        border_weight: dict[str, Any] | None = None,
        arch: str | None = None,
        **settings: Any,
    ):
        """`net`: the network (`unet`, or `encoder_decoder`: a timm `backbone` under an smp `head`); its settings are
        the other keywords it takes. `rand_error_class` (a class index or name): also log `val/rand_error` and
        `test/rand_error`, the Rand error of that class's objects (ISBI 2012: the cells). `border_weight`
        ({objects, w0, sigma, balance}): weigh each training pixel's cross-entropy by the U-Net paper's map, which
        stresses the borders between nearby objects (`seg_weights`). `arch` is the name checkpoints written before
        `net` used."""
        net = arch or net
        network, base = create_network(net, settings | dict(num_classes=num_classes, in_chans=in_chans,
                                                             img_size=img_size))
        super().__init__(**({"monitor": "val/miou", "monitor_mode": "max"} | base))
        self.save_hyperparameters()
        self.net = network
        if inference not in ("slide", "whole"):
            raise UserError(f"model.inference={inference}: use slide (tiles of the training crop size) or whole.")
        if ignore_index != 255:
            raise UserError(f"model.ignore_index={ignore_index}: the data marks unlabeled pixels (and the padding of "
                            "crops) with 255, so that is the index the loss and metrics must ignore; map your own "
                            "unlabeled value to 255 with data.label_map instead.")
        self.fixed_size = bool(getattr(self.net, "fixed_input_size", False))
        self.multiple = int(getattr(self.net, "input_multiple", 1))
        if self.fixed_size and inference == "whole":
            log.warning("model.inference=whole: model.net=%s takes only %d px inputs, so larger images are still "
                        "evaluated in sliding windows", net, img_size)
        if img_size % self.multiple:
            raise UserError(f"data.image_size={img_size}: model.net={net} (model.backbone with model.head) needs "
                            f"crops whose side is a multiple of {self.multiple}; set data.image_size="
                            f"{max(self.multiple, round(img_size / self.multiple) * self.multiple)}.")
        self.ignore_index, self.dice_weight = int(ignore_index), float(dice_weight or 0.0)
        if dice_weight:
            from segmentation_models_pytorch.losses import DiceLoss

            self.dice = DiceLoss("multiclass", from_logits=True, ignore_index=ignore_index)
        self.class_names = list(class_names or [str(i) for i in range(num_classes)])
        self.palette = palette
        if palette is None:
            from attnlab.data.segmentation.datamodule import default_palette

            self.palette = default_palette(num_classes)
        self.mean = list(mean or [0.5] * in_chans)
        self.std = list(std or [0.5] * in_chans)
        cm = dict(num_classes=num_classes, ignore_index=ignore_index, validate_args=False)
        self.val_cm, self.test_cm = MulticlassConfusionMatrix(**cm), MulticlassConfusionMatrix(**cm)
        self.val_rand = self.test_rand = None
        if rand_error_class is not None:
            obj = self._class_index(rand_error_class)
            self.val_rand, self.test_rand = RandError(obj, ignore_index), RandError(obj, ignore_index)
        self.border = check_border_weight(border_weight, self.class_names)
        self._media: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.test_iou: dict[str, float] = {}

    def _class_index(self, cls: int | str) -> int:
        if isinstance(cls, str) and cls in self.class_names:
            return self.class_names.index(cls)
        if isinstance(cls, int) and 0 <= cls < len(self.class_names):
            return cls
        raise UserError(f"model.rand_error_class={cls} is not a class: give an index 0..{len(self.class_names) - 1} "
                        f"or a name of data.classes ({', '.join(self.class_names)}).")

    # ---- forward
    def no_weight_decay(self) -> set[str]:
        """The backbone's position tables (Swin's relative position bias, absolute position embeddings): smp's
        feature wrapper hides timm's own `no_weight_decay()`, so they are found by name."""
        return {n for n, _ in self.named_parameters() if n.rsplit(".", 1)[-1] in NO_DECAY_LEAVES}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run_net(x)  # (B, C, h, w) -> (B, K, h, w)

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for whole images of any size. (B, C, H, W) -> (B, K, H, W). With `tta`, the log of the class
        probabilities averaged over the flipped views."""
        views = TTA_FLIPS[self.hparams.get("tta") or "none"]
        if len(views) == 1:
            return self._infer_view(x)
        probs = sum(self._infer_view(x.flip(d)).float().softmax(1).flip(d) for d in views) / len(views)
        return probs.clamp_min(1e-12).log()                              # (B, K, H, W)

    def _infer_view(self, x: torch.Tensor) -> torch.Tensor:
        s, (h, w) = self.hparams.img_size, x.shape[-2:]
        if self.fixed_size or (self.hparams.inference == "slide" and (h > s or w > s)):
            return sliding_window(self, x, s, self.hparams.window_overlap)
        return pad_forward(self, x, self.multiple)

    def loss(self, logits: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """Cross-entropy (each pixel's times `weight` (B, H, W) where given) + dice_weight x dice."""
        ignore = self.ignore_index
        ce = F.cross_entropy(logits.float(), y, ignore_index=ignore, reduction="none" if weight is not None else "sum")
        if weight is not None:
            ce = (ce * weight).sum()
        # mean over labelled pixels; 0 (not NaN) for a crop with no labelled pixel
        ce = ce / (y != ignore).sum().clamp_min(1)
        if self.dice_weight:
            ce = ce + self.dice_weight * self.dice(logits.float(), y)
        return ce

    # ---- steps
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """With `border_weight`, a training batch gains its pixel weights (B, s, s), computed on the host (in the
        main process, before the batch moves to the device)."""
        if self.border is None or not self.trainer.training:
            return batch
        x, y = batch
        maps = [border_weights(m, ignore_index=self.ignore_index, **self.border) for m in y.numpy()]
        return x, y, torch.from_numpy(np.stack(maps))

    def training_loss(self, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        return self.loss(self.net(x), y, weight)  # (B, C, s, s) -> (B, K, s, s) -> ()

    def training_step(self, batch, batch_idx):
        x, y, *weight = batch  # (B, C, s, s), (B, s, s), with border_weight (B, s, s)
        if self.border is not None and not weight:
            raise UserError(f"model.border_weight is set, but the training batches came without their weights: the "
                            f"data module ({type(self.trainer.datamodule).__name__}) overrides "
                            "on_before_batch_transfer, which Lightning then calls instead of the model's. Call "
                            "Segmenter.on_before_batch_transfer from it, or set model.border_weight=null.")
        try:
            loss = self.run_training_loss(x, y, *weight)
        except ValueError as e:
            if "Expected more than 1 value per channel" in str(e):
                raise UserError(f"a training batch of {x.shape[0]} image: the pooling branch of model.head="
                                f"{self.hparams.head} normalizes over the batch and needs at least 2 images. "
                                "Set data.batch_size to 2 or more.") from e
            raise
        self.log_train_loss(loss, x.shape[0], epoch_mean=True)
        return loss

    def _eval_step(self, batch, cm: MulticlassConfusionMatrix, rand: RandError | None, stage: str) -> torch.Tensor:
        x, y = batch
        logits = self.infer(x)
        self.log(f"{stage}/loss", self.loss(logits, y), on_epoch=True, prog_bar=stage == "val", sync_dist=True,
                 batch_size=x.shape[0])
        pred = logits.argmax(1)  # (B, H, W)
        cm.update(pred, y)
        if rand is not None:
            rand.update(pred, y)
            self.log(f"{stage}/rand_error", rand, on_epoch=True, on_step=False)
        return pred

    def validation_step(self, batch, batch_idx):
        pred = self._eval_step(batch, self.val_cm, self.val_rand, "val")
        x, y = batch
        for i in range(min(len(x), self.hparams.media_images - len(self._media))):
            self._media.append((denormalize(x[i], self.mean, self.std), y[i].cpu().numpy(), pred[i].cpu().numpy()))
        return pred

    def on_validation_epoch_start(self) -> None:
        self._media = []

    def on_validation_epoch_end(self):
        _, miou, acc = iou_from_confusion(self.val_cm.compute())
        self.val_cm.reset()
        self.log("val/miou", miou, prog_bar=True, sync_dist=True)
        self.log("val/pixel_acc", acc, sync_dist=True)
        self.log_best(miou)
        if not self.trainer.sanity_checking and self.trainer.is_global_zero and self._media:
            self._save_media()
        self._media = []

    def _save_media(self) -> Path | None:
        return save_media(self.trainer, "val/overlays", overlay_grid(self._media, self.palette),
                          "image | ground truth | prediction")

    def test_step(self, batch, batch_idx):
        return self._eval_step(batch, self.test_cm, self.test_rand, "test")

    def on_test_epoch_end(self):
        iou, miou, acc = iou_from_confusion(self.test_cm.compute())
        self.test_cm.reset()
        self.log("test/miou", miou, sync_dist=True)
        self.log("test/pixel_acc", acc, sync_dist=True)
        self.test_iou = {name: float(v) for name, v in zip(self.class_names, iou.tolist())}
        for name, value in self.test_iou.items():
            if not math.isnan(value):
                self.log(f"test/iou/{name}", value, sync_dist=True)
        if self.trainer.is_global_zero:
            on_val = bool(getattr(self.trainer.datamodule, "test_is_validation", False))
            print(self.iou_table(float(miou), float(acc), on_val), flush=True)
            log_table(self.trainer, "test/iou_table", ["class", "iou"], [[n, v] for n, v in self.test_iou.items()])

    def iou_table(self, miou: float, acc: float, on_validation_split: bool = False) -> str:
        width = max(12, *(len(n) for n in self.class_names))
        split = ", on the validation split" if on_validation_split else ""
        lines = [f"Per-class IoU (test{split}):", f"  {'class':<{width}}  IoU"]
        lines += [f"  {n:<{width}}  " + ("  -   (absent)" if math.isnan(v) else f"{v:.4f}")
                  for n, v in self.test_iou.items()]
        lines += [f"  {'mean (mIoU)':<{width}}  {miou:.4f}", f"  {'pixel acc':<{width}}  {acc:.4f}"]
        return "\n".join(lines)

    def predict_step(self, batch, batch_idx):
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self.infer(x).argmax(1)

    def flops_per_sample(self) -> float | None:
        from attnlab.utils.flops import training_flops_per_sample

        h = self.hparams
        return training_flops_per_sample(self.net, (h.in_chans, h.img_size, h.img_size))
