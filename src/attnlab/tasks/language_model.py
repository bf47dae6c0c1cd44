"""Language-model pretraining: GPT next-token prediction (`CausalLM`) and BERT masked-LM (`MaskedLM`).

Both take their network's settings as plain values and the tokenizer as a JSON string (from the data), which is
stored in every checkpoint, so `load_from_checkpoint` rebuilds the model and predict.py can encode and decode.
Metrics: `train/loss`, `val/loss`, `val/ppl` (exp of the loss), `val/loss_best`, MLM `val/acc` on the masked
tokens, and the same under `test/`.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric

from attnlab.data.info import DataInfo
from attnlab.data.text.tokenizers import TextTokenizer, tokenizer_from_json
from attnlab.errors import UserError
from attnlab.nn.gpt import check_length
from attnlab.nn.registry import create_network
from attnlab.tasks.base import BaseTask, TokenizerInCheckpoint
from attnlab.types import PositiveInt
from attnlab.utils.media import log_table

log = logging.getLogger("attnlab")


class _LanguageModel(TokenizerInCheckpoint, BaseTask):
    """What both objectives share: tokenizer in the checkpoint, loss/ppl metrics, checks against the data."""

    objective: str
    length_key: str  # the data's sequence length setting this model must cover

    # ---- starting from published weights (model.init_from=hf:<BERT or GPT-2 weights>)
    @classmethod
    def init_tokenizer(cls, init_from: str) -> str | None:
        return _hf(init_from).read_tokenizer(init_from)

    @classmethod
    def init_settings(cls, init_from: str) -> dict[str, Any]:
        return _hf(init_from).init_settings(init_from)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self._resumed = True  # the run's own weights: init_from is not read again

    def on_fit_start(self) -> None:
        if self.hparams.get("init_from") and not getattr(self, "_resumed", False):
            _hf(self.hparams.init_from).load_into(self.net, self.hparams.init_from, keep_new=())

    def _init_common(self, tokenizer: str | None, objective: str) -> None:
        if objective != self.objective:
            raise UserError(f"model.objective={objective}, but {type(self).__name__} trains the {self.objective} "
                            f"objective: set data.objective={self.objective} (model.objective follows it).")
        self.tokenizer_json = tokenizer
        self.metrics = torch.nn.ModuleDict({f"{s}_{m}": MeanMetric() for s in ("val", "test") for m in ("loss", "acc")})

    def check_data(self, info: DataInfo) -> None:
        vocab, have = info.vocab_size, self.hparams.get("vocab_size")
        if vocab is not None and have is not None and vocab > have:
            raise UserError(
                f"the tokenizer has {vocab} tokens but the model's vocabulary is model.vocab_size={have}: token ids "
                f"past it have no embedding. Let the model follow the data (model.vocab_size=${{data.vocab_size}}, "
                f"the default) or set model.vocab_size>={vocab}."
            )
        if info.objective not in (None, self.objective):
            raise UserError(f"data.objective={info.objective}, but {type(self).__name__} trains the {self.objective} "
                            f"objective: set data.objective={self.objective} (model.objective follows it).")
        if getattr(info, self.length_key) is not None:
            check_length(int(getattr(info, self.length_key)), self.max_positions, f"model.{self.length_key}")
        if self.tokenizer_json is not None and info.tokenizer is not None and not same_vocabulary(
                self.tokenizer, tokenizer_from_json(info.tokenizer)):
            raise UserError(
                "the data was tokenized with another vocabulary than the model's: the checkpoint's tokenizer was "
                "learned on its own training corpus, and these files (or tokenizer settings) gave a different one, "
                "so token ids would mean other text. Evaluate or continue on data with the same corpus and "
                "data.tokenizer settings as the run that wrote the checkpoint."
            )

    def flops_per_sample(self) -> float | None:
        return self.net.flops_per_token(self.max_positions) * self.max_positions

    def flops_of(self, batch) -> float:
        """Training FLOPs of one batch, from its real sequence length (shorter than the positional table)."""
        B, T = self.input_ids(batch).shape
        return self.net.flops_per_token(T) * B * T

    def tokens_of(self, batch) -> int:
        return int(self.input_ids(batch).numel())

    # ---- evaluation bookkeeping
    def _eval_update(self, stage: str, loss: torch.Tensor, weight: torch.Tensor | float = 1.0,
                     acc: torch.Tensor | None = None) -> None:
        self.metrics[f"{stage}_loss"].update(loss.detach(), weight)
        if acc is not None:
            self.metrics[f"{stage}_acc"].update(acc, weight)

    def _eval_end(self, stage: str) -> torch.Tensor:
        loss = self.metrics[f"{stage}_loss"].compute()
        self.log(f"{stage}/loss", loss, prog_bar=stage == "val", sync_dist=True)
        self.log(f"{stage}/ppl", torch.exp(loss.clamp(max=50)), sync_dist=True)
        if self.objective == "masked":
            self.log(f"{stage}/acc", self.metrics[f"{stage}_acc"].compute(), prog_bar=stage == "val", sync_dist=True)
        for key in ("loss", "acc"):
            self.metrics[f"{stage}_{key}"].reset()
        return loss

    def on_validation_epoch_end(self) -> None:
        loss = self._eval_end("val")
        self.log_best(loss)
        if not self.trainer.sanity_checking and self.trainer.is_global_zero and self.tokenizer is not None:
            self.log_samples()

    def on_test_epoch_end(self) -> None:
        self._eval_end("test")

    def log_samples(self) -> None:
        pass


class CausalLM(_LanguageModel):
    """GPT next-token prediction (`net`: gpt, or any registered decoder taking vocab_size and block_size). Network
    settings are GPTConfig's (n_layer, n_head, n_embd, positional, ...);
    `num_samples` texts of `sample_tokens` tokens, started from `sample_prompt`, are logged at every `sample_every`-th
    validation and at the last of training."""

    objective = "causal"
    length_key = "block_size"

    def __init__(self, vocab_size: int, block_size: int = 256, net: str = "gpt",
                 objective: Literal["causal"] = "causal", tokenizer: str | None = None, init_from: str | None = None,
                 num_samples: int = 2, sample_tokens: int = 200, sample_prompt: str | None = "\n",
                 sample_temperature: float = 0.8, sample_top_k: int | None = 200, sample_every: PositiveInt = 1,
                 **settings: Any):
        network, base = create_network(net, settings | {"vocab_size": vocab_size, "block_size": block_size})
        super().__init__(**({"monitor": "val/loss", "monitor_mode": "min"} | base))
        self.save_hyperparameters(ignore=["tokenizer"])
        self.net = network
        self.max_positions = block_size
        self._init_common(tokenizer, objective)
        self._first_val_ids: torch.Tensor | None = None
        self._validations = 0

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.run_net(idx)                                   # (B, T, V)

    def _loss(self, batch) -> torch.Tensor:
        x, y = batch                                               # (B, T) each
        logits = self(x)                                           # (B, T, V)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))

    def training_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.net(x)                                       # (B, T, V)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))

    def training_step(self, batch, batch_idx):
        loss = self.run_training_loss(*batch)
        self.log_train_loss(loss, batch[0].shape[0])
        return loss

    def validation_step(self, batch, batch_idx):
        if batch_idx == 0:
            self._first_val_ids = batch[0][:1, :1].detach()
        self._eval_update("val", self._loss(batch), batch[1].numel())  # a mean over tokens, the last batch too

    def test_step(self, batch, batch_idx):
        self._eval_update("test", self._loss(batch), batch[1].numel())

    @staticmethod
    def input_ids(batch) -> torch.Tensor:
        return batch[0]

    # ---- sampling
    def prompt_ids(self, prompt: str | None) -> torch.Tensor:
        """(1, T) ids of `prompt`; an empty encoding falls back to the first token of the validation data."""
        try:
            ids = self.tokenizer.encode(prompt) if prompt else []
        except UserError as e:
            raise UserError(f"prompt={prompt!r}: {e}") from None
        if ids:
            return torch.tensor([ids], dtype=torch.long, device=self.device)
        if self._first_val_ids is not None:
            return self._first_val_ids.to(self.device)
        return torch.zeros(1, 1, dtype=torch.long, device=self.device)

    def log_samples(self) -> None:
        h = self.hparams
        self._validations += 1
        if not h.num_samples or not h.sample_tokens:
            return
        if self._validations % h.get("sample_every", 1) and not 0 < self.trainer.max_steps <= self.global_step:
            return  # not a sampling validation, nor the last of training
        was_training = self.net.training
        self.net.eval()
        rows = []
        try:
            idx = self.prompt_ids(h.sample_prompt)
        except UserError as e:
            log.warning("model.sample_prompt: %s Sampling from the first validation token instead.", e)
            idx = self.prompt_ids(None)
        try:  # the samples as one batch: one pass per token for all of them
            out = self.net.generate(idx.expand(int(h.num_samples), -1), int(h.sample_tokens), h.sample_temperature,
                                    h.sample_top_k)                  # (num_samples, T + sample_tokens)
            for i, ids in enumerate(out.tolist()):
                text = self.tokenizer.decode(ids)
                log.info("sample %d at step %d:\n%s", i + 1, self.global_step, text)
                rows.append([self.global_step, h.sample_prompt, text])
        finally:
            self.net.train(was_training)
        log_table(self.trainer, "val/samples", ["step", "prompt", "text"], rows)

class MaskedLM(_LanguageModel):
    """BERT masked-language-model pretraining; batches come masked from the data (input_ids, attention_mask,
    labels with -100 at unmasked positions). At each validation, a few predictions are logged."""

    objective = "masked"
    length_key = "max_length"

    def __init__(self, vocab_size: int, max_length: int = 128, net: str = "bert",
                 objective: Literal["masked"] = "masked", tokenizer: str | None = None, init_from: str | None = None,
                 num_samples: int = 2, **settings: Any):
        network, base = create_network(net, settings | {"vocab_size": vocab_size, "max_length": max_length})
        super().__init__(**({"monitor": "val/loss", "monitor_mode": "min"} | base))
        self.save_hyperparameters(ignore=["tokenizer"])
        self.net = network
        self.max_positions = max_length
        self._init_common(tokenizer, objective)
        self._sample_batch: dict | None = None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        return self.run_net(input_ids, attention_mask, positions)  # (B, T, V), or (N, V) at `positions`

    def _step(self, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        positions, target = batch["masked_positions"], batch["masked_labels"]  # (N,): -100 where padded
        logits = self(batch["input_ids"], batch["attention_mask"], positions)  # (N, V): the masked positions only
        loss = F.cross_entropy(logits, target)
        real = target != -100
        n = real.sum()
        acc = ((logits.argmax(-1) == target) & real).sum() / n.clamp(min=1)
        return loss, acc, n, logits

    def training_loss(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, masked_positions: torch.Tensor,
                      masked_labels: torch.Tensor) -> torch.Tensor:
        logits = self.net(input_ids, attention_mask, masked_positions)  # (N, V): the masked positions only
        return F.cross_entropy(logits, masked_labels)                   # padding (-100) ignored

    def training_step(self, batch, batch_idx):
        loss = self.run_training_loss(batch["input_ids"], batch["attention_mask"], batch["masked_positions"],
                                      batch["masked_labels"])
        self.log_train_loss(loss, batch["input_ids"].shape[0])
        return loss

    def validation_step(self, batch, batch_idx):
        loss, acc, n, logits = self._step(batch)
        self._eval_update("val", loss, n.float(), acc)
        if batch_idx == 0:
            k = min(int(self.hparams.num_samples or 0), batch["input_ids"].shape[0])
            real = batch["masked_labels"] != -100
            pred = torch.full_like(batch["labels"], -100)
            pred.view(-1)[batch["masked_positions"][real]] = logits.argmax(-1)[real]
            self._sample_batch = {key: batch[key][:k].detach() for key in ("input_ids", "attention_mask", "labels")}
            self._sample_batch["pred"] = pred[:k]

    def test_step(self, batch, batch_idx):
        loss, acc, n, _ = self._step(batch)
        self._eval_update("test", loss, n.float(), acc)

    @staticmethod
    def input_ids(batch) -> torch.Tensor:
        return batch["input_ids"]

    def log_samples(self) -> None:
        b, tok = self._sample_batch, self.tokenizer
        if not b:
            return
        rows = []
        for i in range(b["input_ids"].shape[0]):
            real = b["attention_mask"][i].bool()
            masked = b["labels"][i] != -100
            ids = b["input_ids"][i][real].tolist()
            truth = torch.where(masked, b["labels"][i], b["input_ids"][i])[real].tolist()
            pred = torch.where(masked, b["pred"][i], b["input_ids"][i])[real].tolist()
            row = [show_tokens(tok, ids), show_tokens(tok, truth), show_tokens(tok, pred)]
            log.info("masked-LM sample %d at step %d:\n  input:     %s\n  original:  %s\n  predicted: %s", i + 1,
                     self.global_step, *row)
            rows.append([self.global_step, *row])
        log_table(self.trainer, "val/samples", ["step", "input", "original", "predicted"], rows)

def _hf(init_from: str):
    """attnlab.transfer.hf, for an init_from it reads (hf:<name or folder>)."""
    from attnlab.transfer import hf

    if not hf.is_hf(init_from):
        raise UserError(f"model.init_from={init_from}: a language model starts from published weights, "
                        "hf:<hub name or local folder> (BERT or GPT-2, e.g. hf:gpt2). To continue an attnlab run "
                        "use ckpt_path=<its checkpoint> instead.")
    return hf


def same_vocabulary(a: TextTokenizer, b: TextTokenizer) -> bool:
    return a.vocab_size == b.vocab_size and all(a.id_to_token(i) == b.id_to_token(i) for i in range(a.vocab_size))


def show_tokens(tok: TextTokenizer, ids: list[int]) -> str:
    """Readable text of ids, special tokens shown by name."""
    out, run = [], []
    for i in ids:
        name = tok.id_to_token(i)
        if name.startswith("[") and name.endswith("]") and tok.token_to_id(name) == i and len(name) > 2:
            if run:
                out.append(tok.decode(run))
                run = []
            out.append(name)
        else:
            run.append(i)
    if run:
        out.append(tok.decode(run))
    return " ".join(s.strip() for s in out if s.strip()) if tok.kind != "char" else "".join(out)
