"""Sequence-to-sequence translation: one task for every architecture with the seq2seq decoding interface
(the Transformer encoder-decoder, the RNN encoder-decoders); `model.net` names the network class.

Metrics: `train/loss` (label-smoothed), `val/loss` and `val/ppl` (teacher-forced, no smoothing), `val/bleu`
(sacreBLEU on detokenized greedy output, or beam search with decode.val_beam_size > 1), `val/bleu_best`, and
`test/loss`, `test/ppl`, `test/bleu` with beam search (decode.beam_size). At each validation a few fixed sentences
are translated and their attention alignments drawn (PNG in <run>/alignments/, and to W&B).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric

from attnlab.data.info import DataInfo
from attnlab.data.translation.datamodule import tokenizer_pair
from attnlab.errors import UserError
from attnlab.nn.decoding import DecodeSettings, decode, greedy
from attnlab.nn.registry import create_network
from attnlab.tasks.base import BaseTask
from attnlab.types import Fraction, NonNegativeFloat, NonNegativeInt
from attnlab.utils.media import log_images, log_table, run_folder

log = logging.getLogger("attnlab")

DECODE_DEFAULTS = {"beam_size": 5, "val_beam_size": 1, "length_penalty": 1.0, "max_len": 100, "max_len_a": 1.5,
                   "max_len_b": 10}


class Translator(BaseTask):
    """Args:
        net: the network (transformer_seq2seq, rnn_seq2seq, or a class path; attnlab.nn.registry); the remaining
            keyword arguments it takes go to it (n_layer, cell, attention, ...).
        label_smoothing: of the training loss.
        decode: {beam_size, val_beam_size, length_penalty, max_len, max_len_a, max_len_b}.
        num_alignments: fixed validation sentences whose alignments are drawn each validation (0: none).
        grad_clip: gradient norm clipping when trainer.gradient_clip_val is not set (0: none).
    """

    def __init__(self, net: str, src_vocab_size: int, tgt_vocab_size: int, pad_id: int = 0, bos_id: int = 2,
                 eos_id: int = 3, label_smoothing: Fraction = 0.1, decode: DecodeSettings | None = None,
                 num_alignments: NonNegativeInt = 4, num_samples: NonNegativeInt = 8, grad_clip: NonNegativeFloat = 1.0,
                 src_tokenizer: str | None = None, tgt_tokenizer: str | None = None, **kwargs: Any):
        network, base = create_network(net, kwargs | {"src_vocab_size": src_vocab_size,
                                                      "tgt_vocab_size": tgt_vocab_size, "pad_id": pad_id})
        super().__init__(**({"monitor": "val/bleu", "monitor_mode": "max"} | base))
        self.save_hyperparameters(ignore=["src_tokenizer", "tgt_tokenizer"])
        self.net = network
        self.pad_id, self.label_smoothing = int(pad_id), float(label_smoothing)
        self.decode_cfg = DECODE_DEFAULTS | dict(decode or {})
        self.tokenizer_json = (src_tokenizer, tgt_tokenizer)
        self._tokenizers = None
        self.metrics = torch.nn.ModuleDict({f"{s}_loss": MeanMetric() for s in ("val", "test")})
        self._outputs: dict[str, list] = {"hyp": [], "ref": [], "src": []}
        self._fixed: dict | None = None  # the sentences whose alignments are drawn

    # ---- tokenizers travel in the checkpoint
    @property
    def tokenizers(self):
        if self._tokenizers is None and all(self.tokenizer_json):
            self._tokenizers = tokenizer_pair(*self.tokenizer_json)
        return self._tokenizers

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["tokenizers"] = list(self.tokenizer_json)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.tokenizer_json, self._tokenizers = tuple(checkpoint.get("tokenizers") or (None, None)), None

    def check_data(self, info: DataInfo) -> None:
        for key, have in (("src_vocab_size", self.hparams.src_vocab_size),
                          ("tgt_vocab_size", self.hparams.tgt_vocab_size)):
            if getattr(info, key) is not None and getattr(info, key) != have:
                raise UserError(f"the data's {key} is {getattr(info, key)} but the model was built for {have}: the "
                                f"model follows the data (model.{key}=${{data.{key}}}); remove the override.")
        max_len = getattr(getattr(self.net, "config", None), "max_len", None)
        if max_len is not None and (info.max_length or 0) > max_len:
            raise UserError(f"data.max_length={info.max_length} is longer than the model's positional table "
                            f"(model.max_len={max_len}). Set data.max_length<={max_len} (longer sentences are "
                            f"truncated) or model.max_len>={info.max_length}.")

    # ---- training
    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        return self.run_net(src, tgt_in)                                   # (B, T, V)

    def _loss(self, batch: dict, smoothing: float) -> tuple[torch.Tensor, torch.Tensor]:
        tgt = batch["tgt"]                                                 # (B, T+1): [BOS] ... [EOS]
        logits = self(batch["src"], tgt[:, :-1])                           # (B, T, V)
        target = tgt[:, 1:]
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), target.reshape(-1),
                               ignore_index=self.hparams.pad_id, label_smoothing=smoothing)
        return loss, (target != self.hparams.pad_id).sum()

    def training_loss(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        logits = self.net(src, tgt[:, :-1])                                # (B, T, V): teacher forcing
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), tgt[:, 1:].reshape(-1),
                               ignore_index=self.pad_id, label_smoothing=self.label_smoothing)

    def training_step(self, batch, batch_idx):
        loss = self.run_training_loss(batch["src"], batch["tgt"])
        self.log_train_loss(loss, batch["src"].shape[0])
        return loss

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        if gradient_clip_val is None and self.hparams.grad_clip:  # RNNs need clipping; the trainer's setting wins
            gradient_clip_val, gradient_clip_algorithm = self.hparams.grad_clip, "norm"
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    @staticmethod
    def tokens_of(batch) -> torch.Tensor:
        return (batch["src"] != 0).sum() + (batch["tgt"] != 0).sum()  # counted on the device: no wait per step

    @staticmethod
    def batch_size_of(batch: Any) -> int:
        return int(batch["src"].shape[0])

    # ---- evaluation
    def translate(self, src: torch.Tensor, beam_size: int | None = None) -> list[str]:
        """Source ids (B, S) -> detokenized translations."""
        d = self.decode_cfg
        beam = d["beam_size"] if beam_size is None else beam_size
        ids = decode(self.net, src, self.hparams.bos_id, self.hparams.eos_id, self._max_len(src),
                     int(beam), float(d["length_penalty"]), self.banned)
        return [self.tokenizers[1].decode(i).strip() for i in ids]

    @property
    def banned(self) -> tuple[int, ...]:
        """Tokens no translation may contain: padding and BOS."""
        return (int(self.hparams.pad_id), int(self.hparams.bos_id))

    def _max_len(self, src: torch.Tensor) -> int:
        """Output tokens at most: decode.max_len, and max_len_a * source length + max_len_b (as fairseq)."""
        d, limit = self.decode_cfg, getattr(self.net.config, "max_len", None)
        n = min(int(d["max_len"]), int(float(d["max_len_a"]) * src.shape[1] + float(d["max_len_b"])))
        return min(n, limit - 1) if limit else n

    def _eval_step(self, stage: str, batch: dict, beam_size: int) -> None:
        loss, n = self._loss(batch, 0.0)
        self.metrics[f"{stage}_loss"].update(loss.detach(), n.float())
        if self.tokenizers is not None:
            self._outputs["hyp"].extend(self.translate(batch["src"], beam_size))
            self._outputs["ref"].extend(batch["ref"])
            self._outputs["src"].extend(batch["src_text"])

    def validation_step(self, batch, batch_idx):
        if batch_idx == 0 and self._fixed is None and self.hparams.num_alignments:
            k = int(self.hparams.num_alignments)  # evaluation batches come in a fixed order: the same each epoch
            self._fixed = {"src": batch["src"][:k].detach().cpu(), "src_text": list(batch["src_text"][:k])}
        self._eval_step("val", batch, int(self.decode_cfg["val_beam_size"]))

    def test_step(self, batch, batch_idx):
        self._eval_step("test", batch, int(self.decode_cfg["beam_size"]))

    def _gathered(self) -> tuple[list[str], list[str], list[str]]:
        out = (self._outputs["hyp"], self._outputs["ref"], self._outputs["src"])
        self._outputs = {"hyp": [], "ref": [], "src": []}
        if self.trainer.world_size > 1:
            parts: list = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(parts, out)
            out = tuple(sum((p[i] for p in parts), []) for i in range(3))
        return out

    def _eval_end(self, stage: str) -> None:
        loss = self.metrics[f"{stage}_loss"].compute()
        self.metrics[f"{stage}_loss"].reset()
        self.log(f"{stage}/loss", loss, prog_bar=stage == "val", sync_dist=True)
        self.log(f"{stage}/ppl", torch.exp(loss.clamp(max=50)), sync_dist=True)
        hyps, refs, srcs = self._gathered()
        if not hyps:
            return
        bleu, signature = corpus_bleu(hyps, refs)
        value = torch.tensor(bleu.score, device=self.device)
        self.log(f"{stage}/bleu", value, prog_bar=True)  # the same value on every rank (gathered corpus)
        if stage == "val":
            self.log_best(value)
        if self.trainer.is_global_zero and not self.trainer.sanity_checking:
            beam = self.decode_cfg["val_beam_size" if stage == "val" else "beam_size"]
            log.info("%s BLEU %.2f (beam %s, %d sentences) | sacreBLEU %s", stage, bleu.score, beam, len(hyps),
                     signature)
            self._log_samples(stage, srcs, refs, hyps)

    def on_validation_epoch_end(self) -> None:
        self._eval_end("val")
        if self.trainer.is_global_zero and not self.trainer.sanity_checking and self.hparams.num_alignments:
            self.draw_alignments()

    def on_test_epoch_end(self) -> None:
        self._eval_end("test")

    def _log_samples(self, stage: str, srcs: list[str], refs: list[str], hyps: list[str]) -> None:
        k = min(int(self.hparams.num_samples), len(hyps))
        if not k:
            return
        rows = [[srcs[i], refs[i], hyps[i]] for i in range(k)]
        log.info("%s translations at step %d:\n%s", stage, self.global_step,
                 "\n".join(f"  src: {s}\n  ref: {r}\n  hyp: {h}" for s, r, h in rows))
        log_table(self.trainer, f"{stage}/translations", ["source", "reference", "translation"], rows)

    # ---- alignments
    def alignments(self, src: torch.Tensor) -> list[tuple[list[str], list[str], torch.Tensor]]:
        """(source tokens, output tokens, attention (T_out, S)) per sentence of src (B, S), greedy decoding."""
        was_training = self.net.training
        self.net.eval()
        try:
            ids, maps = greedy(self.net, src, self.hparams.bos_id, self.hparams.eos_id, self._max_len(src),
                               return_attn=True, banned=self.banned)
        finally:
            self.net.train(was_training)
        if maps is None or maps[0] is None or maps[0].numel() == 0 or maps[0].dim() < 2:
            return []
        src_tok, tgt_tok = self.tokenizers
        out = []
        for row, out_ids, attn in zip(src.tolist(), ids, maps):
            real = [t for t in row if t != self.hparams.pad_id]
            out.append(([_piece(src_tok, t) for t in real], [_piece(tgt_tok, t) for t in out_ids] + ["[EOS]"],
                        attn[:, : len(real)]))
        return out

    def draw_alignments(self) -> None:
        if getattr(self.net.config, "attention", "transformer") == "none" or self._fixed is None:
            return  # nothing to draw: no attention
        from attnlab.tasks.alignment import plot_alignment

        folder = run_folder(self.trainer, "alignments")
        if folder is None:  # a Trainer without a run folder: no files to draw into
            return
        images = []
        for i, (src, tgt, attn) in enumerate(self.alignments(self._fixed["src"].to(self.device))):
            path = folder / f"step{self.global_step:06d}_{i}.png"
            plot_alignment(attn.float().numpy(), src, tgt, path, title=self._fixed["src_text"][i])
            images.append(path)
        log_images(self.trainer, "val/alignments", [(p, p.stem) for p in images])

def _piece(tok, i: int) -> str:
    """A token as shown on an alignment axis: its text, or (a byte-level piece of a character) its vocabulary
    entry without BPE's space marker."""
    text = tok.decode([i]).strip()
    if text and text.isprintable() and "\ufffd" not in text:
        return text
    return tok.id_to_token(i).lstrip("Ġ") or "?"


def corpus_bleu(hyps: list[str], refs: list[str]):
    """sacreBLEU's corpus BLEU (13a tokenization, one reference) and its signature string."""
    from sacrebleu.metrics import BLEU

    metric = BLEU()
    return metric.corpus_score(hyps, [refs]), str(metric.get_signature())
