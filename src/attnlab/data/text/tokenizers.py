"""Tokenizers for the text data: characters, byte-level BPE and WordPiece trained with Hugging Face
`tokenizers` on the training split, or a pretrained tokenizer from the hub. Trained tokenizers are cached under
the cache directory, keyed by the corpus and the settings, so a second run loads instead of retraining.

Every tokenizer serializes to one JSON string (`to_json` / `tokenizer_from_json`), which the task stores in its
checkpoints: a checkpoint alone is enough to encode prompts and decode samples."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from attnlab.errors import UserError
from attnlab.utils.atomic import atomic_path, write_text

log = logging.getLogger("attnlab")

KINDS = ("char", "bpe", "wordpiece", "pretrained")
PAD, UNK, CLS, SEP, MASK, EOT = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<|endoftext|>"
MLM_SPECIALS = (PAD, UNK, CLS, SEP, MASK)


class TextTokenizer:
    """What the data and the tasks need from a tokenizer."""

    kind: str
    vocab_size: int

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def token_to_id(self, token: str) -> int | None:
        raise NotImplementedError

    def id_to_token(self, i: int) -> str:
        raise NotImplementedError

    def to_json(self) -> str:
        raise NotImplementedError

    def special_id(self, token: str, why: str) -> int:
        i = self.token_to_id(token)
        if i is None:
            raise UserError(
                f"the {self.kind} tokenizer has no {token} token, which {why} needs. Use data.tokenizer=wordpiece "
                "(or a pretrained BERT tokenizer) for masked-LM pretraining."
            )
        return i


class CharTokenizer(TextTokenizer):
    """One id per character of the corpus (nanoGPT's shakespeare_char), plus optional special tokens after them.
    With `lowercase`, the vocabulary holds lowercased characters and encoding lowercases the text first."""

    kind = "char"

    def __init__(self, chars: str, specials: Iterable[str] = (), lowercase: bool = False):
        self.chars, self.specials, self.lowercase = "".join(sorted(set(chars))), list(specials), bool(lowercase)
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.itos = list(self.chars) + self.specials
        self.special_ids = {s: len(self.chars) + i for i, s in enumerate(self.specials)}
        self.vocab_size = len(self.itos)
        self._codes = np.array([ord(c) for c in self.chars], dtype=np.int64)  # sorted, for vectorized encoding

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def normalize(self, text: str) -> str:
        return text.lower() if self.lowercase else text

    def encode_array(self, text: str) -> np.ndarray:
        text = self.normalize(text)
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        pos = np.searchsorted(self._codes, codes).clip(0, max(0, len(self._codes) - 1))
        unknown = self._codes[pos] != codes if len(self._codes) else np.ones(len(codes), dtype=bool)
        if unknown.any():
            bad = sorted({chr(c) for c in codes[unknown]})
            raise UserError(
                f"the text holds characters the character tokenizer does not know: {''.join(bad)!r} "
                f"(its vocabulary is the {len(self.chars)} characters of the training corpus). Remove or replace "
                "them, or train with a tokenizer that covers them (data.tokenizer=bpe handles any text)."
            )
        return pos

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.itos[i] for i in ids if i < len(self.chars))

    def token_to_id(self, token: str) -> int | None:
        return self.special_ids.get(token, self.stoi.get(token))

    def id_to_token(self, i: int) -> str:
        return self.itos[i]

    def to_json(self) -> str:
        return json.dumps({"attnlab_char_tokenizer": {"chars": self.chars, "specials": self.specials,
                                                      "lowercase": self.lowercase}})


class HFTokenizer(TextTokenizer):
    """A Hugging Face `tokenizers.Tokenizer`; special tokens are never added by encode (the data adds them)."""

    def __init__(self, tok, kind: str):
        self.tok, self.kind = tok, kind
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self.tok.token_to_id(token)

    def id_to_token(self, i: int) -> str:
        return self.tok.id_to_token(i)

    def to_json(self) -> str:
        return json.dumps({"attnlab_kind": self.kind, "tokenizer": json.loads(self.tok.to_str())})

    @property
    def normalizes(self) -> bool:
        """Whether the text cleaning (lowercasing, Unicode form) is inside the tokenizer."""
        return self.tok.normalizer is not None


def tokenizer_from_json(text: str) -> TextTokenizer:
    data = json.loads(text)
    if "attnlab_char_tokenizer" in data:
        return CharTokenizer(**data["attnlab_char_tokenizer"])  # saved before `lowercase` existed: False
    from tokenizers import Tokenizer

    return HFTokenizer(Tokenizer.from_str(json.dumps(data["tokenizer"])), data["attnlab_kind"])


# ---- building (or loading from the cache)

def train_hf_tokenizer(kind: str, texts: Iterator[str], vocab_size: int, specials: list[str],
                       lowercase: bool = False, min_frequency: int = 2, unicode_form: str | None = None):
    """Byte-level BPE (GPT-2 style: any text encodes, no unknown tokens) or WordPiece (BERT style). The text
    cleaning (`unicode_form`: NFC, NFKC, ...; lowercasing) is the tokenizer's normalizer, so it travels with it."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if kind == "bpe":
        tok = Tokenizer(models.BPE())
        steps = ([getattr(normalizers, unicode_form.upper())()] if unicode_form else []) \
            + ([normalizers.Lowercase()] if lowercase else [])
        if steps:
            tok.normalizer = normalizers.Sequence(steps)
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    else:
        tok = Tokenizer(models.WordPiece(unk_token=UNK))
        tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                            special_tokens=specials, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def load_pretrained(name: str, cache: Path):
    from tokenizers import Tokenizer

    if cache.is_file():
        try:
            return Tokenizer.from_file(str(cache))
        except Exception as e:  # empty or cut short: fetched again
            log.warning("the cached tokenizer %s is damaged (%s): fetching '%s' again", cache, str(e)[:80], name)
    try:
        tok = Tokenizer.from_pretrained(name)
    except Exception as e:
        raise UserError(
            f"could not load the pretrained tokenizer '{name}' from the Hugging Face hub ({type(e).__name__}: {e}). "
            "Check the name (e.g. gpt2, bert-base-uncased) and go online once: it is then cached in "
            f"{cache.parent}. Offline, use a tokenizer trained on your corpus: data.tokenizer=bpe or wordpiece."
        ) from None
    cache.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(cache) as tmp:  # processes of other corpora may fetch the same one
        tok.save(str(tmp))
    return tok


def build_tokenizer(kind: str, corpus_key: str, train_texts, all_texts, cache_dir: Path, vocab_size: int | None,
                    specials: list[str], lowercase: bool = False, min_frequency: int = 2,
                    pretrained: str | None = None, extra_chars: str = "",
                    unicode_form: str | None = None) -> tuple[TextTokenizer, str]:
    """(tokenizer, its cache key). `train_texts` / `all_texts` are callables returning iterators of documents:
    BPE/WordPiece learn from the training split; the character vocabulary covers every split (as nanoGPT's) and
    `extra_chars` (e.g. the separator the data puts between records).

    Processes building the same tokenizer at once (DDP ranks, parallel sweep jobs) take turns through a file lock:
    the first builds it, the others wait and load it."""
    from filelock import FileLock

    from attnlab.data.cache import cache_key

    if kind not in KINDS:
        raise UserError(f"data.tokenizer={kind} is not a tokenizer attnlab knows: use one of {', '.join(KINDS)}.")
    settings = {"kind": kind, "corpus": corpus_key, "vocab_size": vocab_size, "specials": specials,
                "lowercase": lowercase, "min_frequency": min_frequency, "pretrained": pretrained}
    if kind == "char" and extra_chars:  # only then: the keys of every other cached tokenizer stay as they were
        settings["extra_chars"] = "".join(sorted(set(extra_chars)))
    if unicode_form:
        settings["unicode_form"] = unicode_form
    key = cache_key(settings)
    path = Path(cache_dir) / "tokenizers" / f"{kind}-{key}.json"
    tok = _cached_tokenizer(path, lowercase)
    if tok is not None:
        return tok, key
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{path}.lock"):
        tok = _cached_tokenizer(path, lowercase)  # another process may have built it while this one waited
        if tok is not None:
            return tok, key
        tok = _new_tokenizer(kind, train_texts, all_texts, cache_dir, vocab_size, specials, lowercase, min_frequency,
                             pretrained, extra_chars, unicode_form)
        write_text(path, tok.to_json())
    log.info("tokenizer: %s, vocabulary %d, saved to %s", kind, tok.vocab_size, path)
    return tok, key


def _cached_tokenizer(path: Path, lowercase: bool) -> TextTokenizer | None:
    if not path.is_file():
        return None
    try:
        tok = tokenizer_from_json(path.read_text())
    except Exception as e:  # empty or cut short (a full disk, a copy killed half-way): built again, not trusted
        log.warning("the cached tokenizer %s is damaged (%s: %s): building it again", path, type(e).__name__,
                    str(e)[:80])
        return None
    if isinstance(tok, CharTokenizer) and tok.lowercase != lowercase:  # cached before char tokenizers lowercased
        return None
    log.info("tokenizer: loaded %s", path)
    return tok


def _new_tokenizer(kind, train_texts, all_texts, cache_dir, vocab_size, specials, lowercase, min_frequency,
                   pretrained, extra_chars, unicode_form=None) -> TextTokenizer:
    if kind == "char":
        chars: set[str] = set(extra_chars.lower() if lowercase else extra_chars)
        for doc in all_texts():
            chars.update(doc.lower() if lowercase else doc)
        return CharTokenizer("".join(chars), specials, lowercase)
    if kind == "pretrained":
        if not pretrained:
            raise UserError("data.tokenizer=pretrained needs data.pretrained_tokenizer=<hub name>, e.g. gpt2 "
                            "or bert-base-uncased.")
        hub_cache = Path(cache_dir) / "tokenizers" / "hub" / f"{pretrained.replace('/', '--')}.json"
        return HFTokenizer(load_pretrained(pretrained, hub_cache), kind)
    if not vocab_size:
        raise UserError(f"data.tokenizer={kind} is trained on the corpus and needs "
                        "data.tokenizer_vocab_size=<int> (e.g. 8192).")
    log.info("tokenizer: training %s with a vocabulary of %d on the training split", kind, vocab_size)
    return HFTokenizer(train_hf_tokenizer(kind, train_texts(), int(vocab_size), specials, lowercase, min_frequency,
                                          unicode_form), kind)
