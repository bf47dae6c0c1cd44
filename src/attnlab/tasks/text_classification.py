"""Sentence and sentence-pair classification with a Transformer encoder (`model=bert_classifier`), from scratch or
from the encoder of a masked-LM pretraining run (`model.init_from`).

The data says what the labels are (`DataInfo.target`): classes (cross-entropy; `val/acc`, `val/mcc` Matthews
correlation, and for two classes `val/f1`, F1 of the positive class, the higher label), or scores to regress with
one output (MSE; `val/pearson`, `val/spearman`: GLUE's STS-B). Several validation sets (`DataInfo.val_names`: MNLI's
matched, mismatched) are each scored under their name, `val/acc_matched`. Also `val/loss`, `<monitor>_best`, the same
under `test/`; at test, the confusion matrix (`<run dir>/media/test_confusion.png`) and the worst predicted
examples (`test_errors.csv`), also to W&B (`test/confusion_matrix`, `test/errors`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric
from torchmetrics.classification import (BinaryF1Score, BinaryMatthewsCorrCoef, MulticlassAccuracy,
                                         MulticlassConfusionMatrix, MulticlassMatthewsCorrCoef)
from torchmetrics.regression import PearsonCorrCoef, SpearmanCorrCoef

from attnlab.data.info import DataInfo
from attnlab.errors import UserError
from attnlab.nn.registry import create_network, network_settings
from attnlab.protocols.data import Target
from attnlab.protocols.network import regresses
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
        num_errors: the worst predicted test examples logged as a table.
        target / val_names: from the data: classes or scores (a regression), the validation sets' names.
    """

    def __init__(self, vocab_size: int, max_length: int = 128, num_classes: int = 2, net: str = "bert_classifier",
                 tokenizer: str | None = None, class_names: list[str] | None = None,
                 label_smoothing: Fraction = 0.0, init_from: str | None = None, freeze_backbone: bool = False,
                 num_errors: NonNegativeInt = 20, target: str = "classes", val_names: list[str] | None = None,
                 **settings: Any):
        # the sequence length under the network's own name: an encoder's max_length, a decoder's block_size
        length = "block_size" if "block_size" in network_settings(net) else "max_length"
        network, base = create_network(net, settings | {"vocab_size": vocab_size, length: max_length,
                                                         "num_classes": num_classes})
        super().__init__(**({"monitor": "val/acc", "monitor_mode": "max"} | base))
        self.save_hyperparameters(ignore=["tokenizer"])
        self.net = network
        self.target, self.val_names = Target(target), list(val_names or [])
        if self.target is Target.SCORES and not (regresses(network) and num_classes == 1):
            why = (f"model.net={net} predicts classes only (it declares no `regresses`)" if not regresses(network)
                   else f"model.num_classes={num_classes}, where a regression has one output")
            raise UserError(f"the data's labels are scores to regress (data.target=scores, as GLUE's STS-B), but "
                            f"{why}. Use model=bert_classifier or model=gpt_classifier with model.num_classes="
                            "${data.num_classes}.")
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
        self.score_sets(self.val_names)
        logged = [f"val/{m}{x}" for x in self.sets for m in ["loss", *self.metrics_of(num_classes)]]
        if self.monitor not in logged:
            raise UserError(f"model.monitor={self.monitor} is not a metric of this task, which logs "
                            f"{', '.join(logged)}: set model.monitor to one of them.")
        self.test_cm = MulticlassConfusionMatrix(num_classes) if self.target is Target.CLASSES else None
        self._errors: list[tuple] = []

    def score_sets(self, val_names: list[str]) -> None:
        """One set of metrics per stage and validation set: "val/acc", "val/acc_matched", "test/pearson", ..."""
        self.sets = [f"_{n}" for n in val_names] or [""]
        k = self.hparams.num_classes
        self.losses = torch.nn.ModuleDict({f"{st}{x}": MeanMetric() for st in ("val", "test") for x in self.sets})
        self.scores = torch.nn.ModuleDict({f"{st}{x}": torch.nn.ModuleDict(self.metrics_of(k))
                                           for st in ("val", "test") for x in self.sets})

    def metrics_of(self, num_classes: int) -> dict[str, torch.nn.Module]:
        """What a validation set is scored by, as GLUE reports it (attnlab.data.text.glue_tasks)."""
        if self.target is Target.SCORES:
            return {"pearson": PearsonCorrCoef(), "spearman": SpearmanCorrCoef()}
        if num_classes == 2:
            return {"acc": MulticlassAccuracy(2, average="micro"), "f1": BinaryF1Score(),
                    "mcc": BinaryMatthewsCorrCoef()}
        return {"acc": MulticlassAccuracy(num_classes, average="micro"),
                "mcc": MulticlassMatthewsCorrCoef(num_classes)}

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
        if list(info.val_names or []) != self.val_names:  # evaluated on other sets (an MNLI model on AX)
            self.val_names = list(info.val_names or [])
            self.score_sets(self.val_names)
            self.to(self.device)
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

    def predictions(self, logits: torch.Tensor) -> torch.Tensor:
        """(B, K) logits -> (B,) the class index, or the score (one output)."""
        return logits[:, 0] if self.target is Target.SCORES else logits.argmax(-1)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, smoothing: float = 0.0) -> torch.Tensor:
        if self.target is Target.SCORES:
            return F.mse_loss(logits[:, 0], labels.float())
        return F.cross_entropy(logits, labels, label_smoothing=smoothing)

    def training_loss(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      token_type_ids: torch.Tensor | None, labels: torch.Tensor) -> torch.Tensor:
        logits = self.net(input_ids, attention_mask, token_type_ids)       # (B, K)
        return self.loss(logits.float(), labels, self.label_smoothing)

    def training_step(self, batch, batch_idx):
        loss = self.run_training_loss(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
                                      batch["labels"])
        self.log_train_loss(loss, batch["labels"].shape[0])
        return loss

    def _eval_step(self, stage: str, batch: dict, dataloader_idx: int) -> torch.Tensor:
        logits = self._logits(batch).float()                               # (B, K)
        y, key = batch["labels"], f"{stage}{self.sets[dataloader_idx]}"
        self.losses[key].update(self.loss(logits, y), y.shape[0])
        pred = self.predictions(logits)                                    # (B,)
        for metric in self.scores[key].values():
            metric.update(pred, y.to(pred.dtype) if self.target is Target.SCORES else y)
        return pred

    def validation_step(self, batch, batch_idx, dataloader_idx: int = 0):
        self._eval_step("val", batch, dataloader_idx)

    def test_step(self, batch, batch_idx, dataloader_idx: int = 0):
        pred = self._eval_step("test", batch, dataloader_idx)
        y = batch["labels"]
        if self.test_cm is not None:
            self.test_cm.update(pred, y)
        # the worst predicted: misclassified examples, or the largest errors of a score
        errors = (pred != y).float() if self.test_cm is not None else (pred - y).abs()
        for i in errors.nonzero().flatten().tolist():
            label = float(y[i]) if self.test_cm is None else self.class_names[int(y[i])]
            guess = round(float(pred[i]), 4) if self.test_cm is None else self.class_names[int(pred[i])]
            self._errors.append((float(errors[i]), batch["text"][i], label, guess))
        self._errors = sorted(self._errors, key=lambda e: -e[0])[:self.hparams.num_errors]

    def _eval_end(self, stage: str) -> dict[str, torch.Tensor]:
        values = {}
        for x in self.sets:
            key = f"{stage}{x}"
            values[f"{stage}/loss{x}"] = self.losses[key].compute()
            values |= {f"{stage}/{m}{x}": metric.compute() for m, metric in self.scores[key].items()}
            self.losses[key].reset()
            for metric in self.scores[key].values():
                metric.reset()
        for name, value in values.items():
            self.log(name, value, prog_bar=stage == "val" and name == self.monitor, sync_dist=True)
        return values

    def on_validation_epoch_end(self) -> None:
        self.log_best(self._eval_end("val")[self.monitor])

    def on_test_epoch_end(self) -> None:
        self._eval_end("test")
        cm = None
        if self.test_cm is not None:
            cm = self.test_cm.compute()  # synced across processes
            self.test_cm.reset()
        if self.trainer.is_global_zero and not self.trainer.sanity_checking:
            self.write_test_media(cm)
        self._errors = []

    def write_test_media(self, cm: torch.Tensor | None) -> None:
        """<run dir>/media/test_confusion.png (classes) and test_errors.csv (the worst predicted examples), also
        sent to W&B."""
        import csv

        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = [list(e[1:]) for e in self._errors]  # text, label, predicted
        out = run_folder(self.trainer, "media")
        if out is None:  # a Trainer without a run folder: the errors go to W&B alone
            log_table(self.trainer, "test/errors", ["text", "label", "predicted"], rows)
            return
        if cm is not None:
            fig, _ = MulticlassConfusionMatrix(len(self.class_names)).plot(cm.cpu(), labels=self.class_names)
            fig.savefig(out / "test_confusion.png", dpi=100, bbox_inches="tight")
            plt.close(fig)
            log_image(self.trainer, "test/confusion_matrix", out / "test_confusion.png")
        with open(out / "test_errors.csv", "w", newline="") as f:
            csv.writer(f).writerows([["text", "label", "predicted"], *rows])
        log_table(self.trainer, "test/errors", ["text", "label", "predicted"], rows)

    @staticmethod
    def batch_size_of(batch: Any) -> int:
        return int(batch["input_ids"].shape[0])

    def tokens_of(self, batch) -> torch.Tensor:
        return batch["attention_mask"].sum()  # counted on the device: no wait per step
