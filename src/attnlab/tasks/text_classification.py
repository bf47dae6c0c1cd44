"""Sentence and sentence-pair classification with a Transformer encoder (`model=bert_classifier`), from scratch or
from the encoder of a masked-LM pretraining run (`model.init_from`).

Metrics: `train/loss`, `val/loss`, `val/acc`, `val/acc_best`, and for binary tasks `val/f1` (F1 of the positive
class, the higher label) and `val/mcc` (Matthews correlation, GLUE's CoLA metric), and the same under `test/`; at
test, the confusion matrix (`<run dir>/media/test_confusion.png`)
and the misclassified examples (`test_errors.csv`), also to W&B (`test/confusion_matrix`, `test/errors`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric
from torchmetrics.classification import (BinaryF1Score, BinaryMatthewsCorrCoef, MulticlassAccuracy,
                                         MulticlassConfusionMatrix)

from attnlab.data.info import DataInfo
from attnlab.errors import UserError
from attnlab.nn.registry import create_network, network_settings
from attnlab.tasks.base import BaseTask, TokenizerInCheckpoint
from attnlab.types import Fraction, NonNegativeInt
from attnlab.utils.media import log_image, log_table, run_folder


class TextClassifier(TokenizerInCheckpoint, BaseTask):
    """Args:
        net: the network (`bert_classifier`, `gpt_classifier`); its settings are the other keywords it takes
            (n_layer, n_head, ...).
        tokenizer / class_names: from the data (kept in the checkpoint for predict.py).
        init_from: the checkpoint (or run folder) of a masked-LM run (bert_classifier) or a causal-LM run
            (gpt_classifier), whose network initializes this one when training starts, or hf:<BERT or GPT-2
            weights, a hub name or a local folder>; their tokenizer is the data's.
        freeze_backbone: train only the pooler and the head (a linear probe of the encoder's [CLS] state).
        num_errors: misclassified test examples logged as a table.
    """

    def __init__(self, vocab_size: int, max_length: int = 128, num_classes: int = 2, net: str = "bert_classifier",
                 tokenizer: str | None = None, class_names: list[str] | None = None,
                 label_smoothing: Fraction = 0.0, init_from: str | None = None, freeze_backbone: bool = False,
                 num_errors: NonNegativeInt = 20, **settings: Any):
        # the sequence length under the network's own name: an encoder's max_length, a decoder's block_size
        length = "block_size" if "block_size" in network_settings(net) else "max_length"
        network, base = create_network(net, settings | {"vocab_size": vocab_size, length: max_length,
                                                         "num_classes": num_classes})
        super().__init__(**({"monitor": "val/acc", "monitor_mode": "max"} | base))
        self.save_hyperparameters(ignore=["tokenizer"])
        self.net = network
        self.label_smoothing = float(label_smoothing)
        self.tokenizer_json = tokenizer
        self.class_names = list(class_names or [str(i) for i in range(num_classes)])
        if freeze_backbone and not hasattr(self.net, "get_classifier"):
            raise UserError(f"model.freeze_backbone=true trains only the classifier head, which attnlab finds through "
                            f"get_classifier(); model.net={net} has none. Add one, or set model.freeze_backbone=false.")
        if freeze_backbone:
            head = {id(p) for p in self.net.get_classifier().parameters()}
            for p in self.net.parameters():
                p.requires_grad = id(p) in head
        self.losses = torch.nn.ModuleDict({s: MeanMetric() for s in ("val", "test")})
        self.accs = torch.nn.ModuleDict({s: MulticlassAccuracy(num_classes, average="micro") for s in ("val", "test")})
        self.binary = torch.nn.ModuleDict({f"{s}_{m}": metric() for s in ("val", "test") for m, metric in
                                        (("f1", BinaryF1Score), ("mcc", BinaryMatthewsCorrCoef))}) \
            if num_classes == 2 else None
        self.test_cm = MulticlassConfusionMatrix(num_classes)
        self._errors: list[list] = []

    # ---- what travels in the checkpoint: the tokenizer (TokenizerInCheckpoint)
    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self._resumed = True  # the run's own weights: init_from is not read again

    @classmethod
    def init_tokenizer(cls, init_from: str) -> str | None:
        """The tokenizer of the weights `init_from` names: the entry point hands it to the data."""
        from attnlab.transfer.bert_mlm import init_tokenizer

        return init_tokenizer(init_from)

    @classmethod
    def init_settings(cls, init_from: str) -> dict[str, Any]:
        """The network settings the weights `init_from` names fix (hf:<weights>: their config.json)."""
        from attnlab.transfer import hf

        return hf.init_settings(init_from) if hf.is_hf(init_from) else {}

    def check_data(self, info: DataInfo) -> None:
        if info.vocab_size is not None and info.vocab_size > self.hparams.vocab_size:
            raise UserError(f"the tokenizer has {info.vocab_size} tokens but model.vocab_size={self.hparams.vocab_size}"
                            ": let the model follow the data (model.vocab_size=${data.vocab_size}).")
        if info.num_classes is not None and info.num_classes != self.hparams.num_classes:
            raise UserError(f"the data has {info.num_classes} classes but the model was built for "
                            f"{self.hparams.num_classes}: evaluate on data with the checkpoint's labels "
                            f"({', '.join(self.class_names[:10])}).")

    def on_fit_start(self) -> None:
        if self.hparams.init_from and not getattr(self, "_resumed", False):
            from attnlab.transfer.bert_mlm import load_mlm_encoder

            load_mlm_encoder(self.net, self.hparams.init_from)

    # ---- steps
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.run_net(input_ids, attention_mask, token_type_ids)    # (B, K)

    def _logits(self, batch: dict) -> torch.Tensor:
        return self(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))

    def training_loss(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      token_type_ids: torch.Tensor | None, labels: torch.Tensor) -> torch.Tensor:
        logits = self.net(input_ids, attention_mask, token_type_ids)       # (B, K)
        return F.cross_entropy(logits.float(), labels, label_smoothing=self.label_smoothing)

    def training_step(self, batch, batch_idx):
        loss = self.run_training_loss(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
                                      batch["labels"])
        self.log_train_loss(loss, batch["labels"].shape[0])
        return loss

    def _eval_step(self, stage: str, batch: dict) -> torch.Tensor:
        logits = self._logits(batch).float()
        y = batch["labels"]
        self.losses[stage].update(F.cross_entropy(logits, y), y.shape[0])
        pred = logits.argmax(-1)
        self.accs[stage].update(pred, y)
        if self.binary is not None:
            for m in ("f1", "mcc"):
                self.binary[f"{stage}_{m}"].update(pred, y)
        return pred

    def validation_step(self, batch, batch_idx):
        self._eval_step("val", batch)

    def test_step(self, batch, batch_idx):
        pred = self._eval_step("test", batch)
        self.test_cm.update(pred, batch["labels"])
        wrong = (pred != batch["labels"]).nonzero().flatten().tolist()
        for i in wrong[: max(0, self.hparams.num_errors - len(self._errors))]:
            self._errors.append([batch["text"][i], self.class_names[int(batch["labels"][i])],
                                 self.class_names[int(pred[i])]])

    def _eval_end(self, stage: str) -> torch.Tensor:
        acc = self.accs[stage].compute()
        self.log(f"{stage}/loss", self.losses[stage].compute(), sync_dist=True)
        self.log(f"{stage}/acc", acc, prog_bar=stage == "val", sync_dist=True)
        if self.binary is not None:
            for m in ("f1", "mcc"):
                self.log(f"{stage}/{m}", self.binary[f"{stage}_{m}"].compute(), sync_dist=True)
                self.binary[f"{stage}_{m}"].reset()
        self.losses[stage].reset()
        self.accs[stage].reset()
        return acc

    def on_validation_epoch_end(self) -> None:
        self.log_best(self._eval_end("val"))

    def on_test_epoch_end(self) -> None:
        self._eval_end("test")
        cm = self.test_cm.compute()  # synced across processes
        self.test_cm.reset()
        if self.trainer.is_global_zero and not self.trainer.sanity_checking:
            self.write_test_media(cm)
        self._errors = []

    def write_test_media(self, cm: torch.Tensor) -> None:
        """<run dir>/media/test_confusion.png and test_errors.csv (misclassified examples), also sent to W&B."""
        import csv

        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        out = run_folder(self.trainer, "media")
        if out is None:  # a Trainer without a run folder: the errors go to W&B alone
            log_table(self.trainer, "test/errors", ["text", "label", "predicted"], self._errors)
            return
        fig, _ = MulticlassConfusionMatrix(len(self.class_names)).plot(cm.cpu(), labels=self.class_names)
        fig.savefig(out / "test_confusion.png", dpi=100, bbox_inches="tight")
        plt.close(fig)
        log_image(self.trainer, "test/confusion_matrix", out / "test_confusion.png")
        with open(out / "test_errors.csv", "w", newline="") as f:
            csv.writer(f).writerows([["text", "label", "predicted"], *self._errors])
        log_table(self.trainer, "test/errors", ["text", "label", "predicted"], self._errors)

    @staticmethod
    def batch_size_of(batch: Any) -> int:
        return int(batch["input_ids"].shape[0])

    def tokens_of(self, batch) -> torch.Tensor:
        return batch["attention_mask"].sum()  # counted on the device: no wait per step
