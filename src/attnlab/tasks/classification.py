"""Image classification with any timm model (ViT, Swin, ConvNeXt, ResNet, ...)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from timm.data import Mixup
from torchmetrics.classification import MulticlassAccuracy

from attnlab.errors import UserError
from attnlab.nn.registry import create_network
from attnlab.tasks.base import BaseTask, has_values
from attnlab.utils.media import log_table, samples_wanted, to_display
from attnlab.types import Fraction


class ImageClassifier(BaseTask):
    """Cross-entropy classifier over a timm backbone, with timm mixup/cutmix and label smoothing.

    Logs `train/loss`, `train/acc`, `val/loss`, `val/acc`, `val/acc5`, `val/acc_best`, and the same under `test/`.

    `init_from`: the checkpoint of an MAE pretraining run (model=mae), or a folder of such runs (its newest
    last.ckpt), whose encoder initializes the ViT backbone when training starts. `freeze_backbone`: train only the
    classifier head (a linear probe).
    """

    def __init__(
        self,
        net: str = "timm",
        num_classes: int = 10,
        img_size: int | None = 224,
        in_chans: int = 3,
        label_smoothing: Fraction = 0.0,
        mixup: dict | None = None,
        class_names: list[str] | None = None,
        init_from: str | None = None,
        freeze_backbone: bool = False,
        **settings: Any,
    ):
        """`net`: the network (`timm`: any timm model named by `backbone`); its settings are the other keywords it
        takes (`backbone`, `pretrained`, `backbone_kwargs`, `drop_path_rate`)."""
        network, base = create_network(net, settings | dict(num_classes=num_classes, img_size=img_size,
                                                             in_chans=in_chans))
        super().__init__(**({"monitor": "val/acc", "monitor_mode": "max"} | base))
        self.save_hyperparameters()
        self.net = network
        self.backbone_name = backbone = str(settings.get("backbone", net))
        if init_from:  # a non-ViT is refused here, before the data; the weights are loaded in setup()
            from attnlab.transfer.mae_vit import require_vit

            require_vit(self.net, backbone)
        if freeze_backbone and not hasattr(self.net, "get_classifier"):
            raise UserError(f"model.freeze_backbone=true trains only the classifier head, which attnlab finds through "
                            f"the network's get_classifier() (timm's convention); {backbone} has none. Add a "
                            "get_classifier() method returning the head module, or set model.freeze_backbone=false.")
        if freeze_backbone:  # a linear probe: only the classifier head trains
            head = {id(p) for p in self.net.get_classifier().parameters()}
            for p in self.net.parameters():
                p.requires_grad = id(p) in head
        self.mixup = Mixup(**mixup, label_smoothing=label_smoothing, num_classes=num_classes) if mixup else None
        self.label_smoothing = float(label_smoothing)
        top5 = min(5, num_classes)
        # no input validation while training: it reads values on the host every step
        self.train_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        self.keep_across_resume("train_acc")
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc5 = MulticlassAccuracy(num_classes, top_k=top5, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc5 = MulticlassAccuracy(num_classes, top_k=top5, average="micro")

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._resumed = True  # the run's own weights: init_from is not read again

    def on_fit_start(self) -> None:
        # here rather than in __init__: eval.py and predict.py rebuild the task from its own checkpoint, and a resumed
        # fit continues from its own weights; neither reads the MAE checkpoint
        if self.hparams.init_from and not getattr(self, "_resumed", False):
            from attnlab.transfer.mae_vit import load_mae_encoder

            load_mae_encoder(self.net, self.hparams.init_from, self.backbone_name)

    def train(self, mode: bool = True):
        super().train(mode)
        if self.hparams.get("freeze_backbone"):  # frozen features: no dropout, drop-path or batch-norm updates
            self.net.eval()
            self.net.get_classifier().train(mode)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run_net(x)  # (B, num_classes)

    def training_loss(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-entropy against class ids (smoothed by label_smoothing) or against mixup's soft targets (which
        hold the smoothing already)."""
        logits = self.net(x)                                                # (B, num_classes)
        smoothing = 0.0 if target.is_floating_point() else self.label_smoothing
        return F.cross_entropy(logits, target, label_smoothing=smoothing), logits

    def training_step(self, batch, batch_idx):
        x, y = batch
        target = y
        if self.mixup is not None and x.shape[0] % 2 == 0:
            x, target = self.mixup(x, y)                                    # mixed images, (B, num_classes) targets
        loss, logits = self.run_training_loss(x, target)
        self.train_acc.update(logits.detach(), y)
        self.log_train_loss(loss, x.shape[0], epoch_mean=True)
        return loss

    def on_train_epoch_end(self):
        super().on_train_epoch_end()
        if has_values(self.train_acc):
            self.log("train/acc", self.train_acc.compute(), sync_dist=True)
        self.train_acc.reset()

    def _eval_step(self, batch, stage: str):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        acc, acc5 = (self.val_acc, self.val_acc5) if stage == "val" else (self.test_acc, self.test_acc5)
        acc.update(logits, y)
        acc5.update(logits, y)
        self.log(f"{stage}/loss", loss, on_epoch=True, prog_bar=stage == "val", sync_dist=True)
        return logits

    def validation_step(self, batch, batch_idx):
        logits = self._eval_step(batch, "val")
        n = samples_wanted(self.trainer) if batch_idx == 0 else 0
        if n:  # the first validation images, to be logged as a W&B table at the end of the epoch
            self._samples = (batch[0][:n].cpu(), batch[1][:n].cpu(), logits[:n].float().softmax(-1).cpu())
        return logits

    def on_validation_epoch_end(self):
        acc = self.val_acc.compute()
        self.log("val/acc", acc, prog_bar=True, sync_dist=True)
        self.log("val/acc5", self.val_acc5.compute(), sync_dist=True)
        self.val_acc.reset()
        self.val_acc5.reset()
        self.log_best(acc)
        self._log_samples()

    def _log_samples(self) -> None:
        samples, self._samples = getattr(self, "_samples", None), None
        if samples is None or self.trainer.sanity_checking:
            return
        import wandb

        names = list(self.hparams.class_names or [str(i) for i in range(self.hparams.num_classes)])
        rows, images = [], []
        for img, y, p in zip(*samples):
            conf, pred = p.max(-1)
            pred_name, label = names[int(pred)], names[int(y)]
            caption = f"predicted {pred_name} ({float(conf):.2f}), label {label}"
            images.append(wandb.Image(to_display(img), caption=caption))
            rows.append([images[-1], pred_name, label, float(conf), pred_name == label])
        log_table(self.trainer, "val/predictions", ["image", "predicted", "label", "confidence", "correct"], rows,
                  images)

    def test_step(self, batch, batch_idx):
        return self._eval_step(batch, "test")

    def on_test_epoch_end(self):
        self.log("test/acc", self.test_acc.compute(), sync_dist=True)
        self.log("test/acc5", self.test_acc5.compute(), sync_dist=True)
        self.test_acc.reset()
        self.test_acc5.reset()

    def predict_step(self, batch, batch_idx):
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(x).softmax(-1)

    def flops_per_sample(self) -> float | None:
        from attnlab.utils.flops import training_flops_per_sample

        h = self.hparams
        return training_flops_per_sample(self.net, (h.in_chans, h.img_size, h.img_size))
