"""`data.decode=gpu`: the JPEGs are decoded on the GPU (nvJPEG, through `torchvision.io.decode_jpeg`), and cropped,
flipped and resized there, instead of in the loader workers.

- In the loader workers (`EncodedFile`): each file is read, and its header parsed; a JPEG in the run's colour mode
  (RGB, or grayscale for `channels: 1`) goes on as its bytes, a 1-D uint8 tensor; anything else (a PNG named
  `.JPEG`, a CMYK JPEG: ImageNet has both) is decoded there by Pillow, to a uint8 (C, H, W) tensor. A batch is
  these, the JPEGs' bytes in one tensor (`EncodedBatch`), and the labels (`collate`).
- Onto the device (`DeviceDecoder.to_device`, the data module's `transfer_batch_to_device`): the batch's JPEGs are
  decoded in one call straight onto the device (the compressed bytes cross PCIe, a tenth of the pixels).
- Ahead of the step (`DecodeAhead`, `data.decode_ahead` batches, training only): the two steps above run on a
  thread and a CUDA stream of their own, so that nvJPEG's host part and the crops' kernel launches overlap the
  model's step instead of coming before it; the step's stream waits on each batch's event, nothing else waits.
- On the device (`DeviceDecoder.__call__`, from `on_after_batch_transfer`): in training, timm's RandomResizedCrop
  (the same draws: `augment.scale`, `augment.ratio`, 10 tries then the centre crop), the crop resized to
  `image_size` with antialiased bicubic (or bilinear, `augment.interpolation`) interpolation, and the flip
  (`augment.hflip`); in evaluation, the shorter side resized to `image_size / crop_pct` and the centre crop. The
  uint8 (B, C, S, S) batch then goes to the normalization and random erasing of every image batch
  (`BatchNormalizer`).

RandAugment, AutoAugment, AugMix and colour jitter are timm's operations on PIL images: with decode=gpu they are
refused, not left out silently (`augment.auto_augment=null` to run without them, or decode=cpu).
"""

from __future__ import annotations

import contextlib
import io
import math
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from attnlab.errors import UserError

DECODES = ("cpu", "gpu")
_ON_PIL_IMAGES = ("auto_augment", "color_jitter", "vflip", "aug_mix")  # timm's, in the workers only


def check_decode(decode: str, augment: dict[str, Any], data_format: str, ahead: int = 0) -> None:
    """Refuse what data.decode=gpu cannot do, in one paragraph each."""
    if decode not in DECODES:
        raise UserError(f"data.decode={decode} is not known: use cpu (decoded in the loader workers) or gpu (JPEGs "
                        "decoded on the GPU with nvJPEG).")
    if isinstance(ahead, bool) or not isinstance(ahead, int) or ahead < 0:
        raise UserError(f"data.decode_ahead={ahead!r} is not a number of batches: set it to 0 (data.decode=gpu "
                        "decodes each batch as the step takes it) or more (that many batches decoded ahead of the "
                        "step, each holding its images on the GPU).")
    if decode != "gpu":
        return
    if data_format != "folder":
        raise UserError(f"data.decode=gpu reads image files (data.format=folder); data.format={data_format} is "
                        "decoded in the loader workers: set data.decode=cpu with it.")
    on_pil = [k for k in _ON_PIL_IMAGES if augment.get(k) not in (None, 0, 0.0, False, "")]
    if on_pil:
        shown = ", ".join(f"augment.{k}={augment[k]}" for k in on_pil)
        raise UserError(
            f"data.decode=gpu decodes, crops, flips and resizes the images on the GPU, but {shown} "
            f"{'is' if len(on_pil) == 1 else 'are'} timm's operations on decoded PIL images in the loader workers. "
            f"Set {' '.join(f'data.augment.{k}=null' for k in on_pil)} to train without "
            f"{'it' if len(on_pil) == 1 else 'them'} on the GPU path, or data.decode=cpu to keep the recipe.")


def check_device(device: torch.device) -> None:
    if device.type != "cuda":
        raise UserError(f"data.decode=gpu decodes the JPEGs with nvJPEG on a CUDA GPU, and this run's device is "
                        f"{device.type}: set data.decode=cpu (or run on a GPU, trainer=gpu).")


class EncodedFile:
    """The loader workers' part of decode=gpu: a file's JPEG bytes as a 1-D uint8 tensor, or (not a JPEG, or a JPEG
    in another colour mode) its pixels decoded by Pillow as a uint8 (C, H, W) tensor. `FileImages` calls
    `from_path` (and turns Pillow's errors into its paragraph on unreadable files)."""

    def from_path(self, path: str, mode: str = "RGB") -> torch.Tensor:
        with open(path, "rb") as f:
            data = f.read()
        with Image.open(io.BytesIO(data)) as img:  # the header only
            if img.format == "JPEG" and img.mode == mode:
                return torch.frombuffer(bytearray(data), dtype=torch.uint8)             # (N,) the file's bytes
            arr = np.asarray(img.convert(mode))
        arr = arr[..., None] if arr.ndim == 2 else arr
        return torch.from_numpy(np.array(arr)).permute(2, 0, 1)                         # (C, H, W) uint8

    def __call__(self, img: Image.Image) -> torch.Tensor:  # an image already decoded (not from a file)
        arr = np.array(img)
        arr = arr[..., None] if arr.ndim == 2 else arr
        return torch.from_numpy(arr).permute(2, 0, 1)


class EncodedBatch:
    """A batch's images as the loader workers send them with decode=gpu: the JPEGs' bytes one after another in one
    tensor and their lengths (one shared-memory segment and one pinned copy per batch, not one per image: over
    twice the images/s from the workers to the step, measured in docs/benchmarks.md), and the images the workers
    decoded themselves (not JPEGs), by position."""

    def __init__(self, data: torch.Tensor, lengths: list[int], decoded: dict[int, torch.Tensor]):
        self.data, self.lengths, self.decoded = data, lengths, decoded          # (N,) uint8; per image, 0 if decoded

    @classmethod
    def of(cls, images: list[torch.Tensor]) -> EncodedBatch:
        encoded = [x for x in images if x.dim() == 1]
        data = torch.cat(encoded) if encoded else torch.empty(0, dtype=torch.uint8)
        return cls(data, [len(x) if x.dim() == 1 else 0 for x in images],
                   {i: x for i, x in enumerate(images) if x.dim() != 1})

    def images(self) -> list[torch.Tensor]:
        """The batch as a list: each JPEG's bytes (a view into `data`), or its decoded (C, H, W) pixels."""
        parts = iter(torch.split(self.data, [n for n in self.lengths if n]))
        return [self.decoded[i] if i in self.decoded else next(parts) for i in range(len(self.lengths))]

    def pin_memory(self) -> EncodedBatch:  # the DataLoader's pin_memory=True
        return EncodedBatch(self.data.pin_memory(), self.lengths, {i: x.pin_memory() for i, x in self.decoded.items()})

    def __len__(self) -> int:
        return len(self.lengths)


def collate(samples: list[tuple[torch.Tensor, int]]) -> tuple[EncodedBatch, torch.Tensor]:
    """[(encoded or decoded image, label)] -> (the images, their sizes differ; labels (B,))."""
    images, labels = zip(*samples)
    return EncodedBatch.of(list(images)), torch.tensor(labels, dtype=torch.long)


class DeviceDecoder:
    """The device's part of decode=gpu: see the module's docstring."""

    def __init__(self, image_size: int, channels: int, augment: dict[str, Any] | None):
        augment = augment or {}
        self.size, self.channels = int(image_size), int(channels)
        self.scale = tuple(augment.get("scale") or (0.08, 1.0))
        self.ratio = tuple(augment.get("ratio") or (3 / 4, 4 / 3))
        self.hflip = float(augment.get("hflip", 0.5) or 0.0)
        self.interpolation = "bilinear" if augment.get("interpolation") == "bilinear" else "bicubic"
        crop_pct = augment.get("crop_pct") or (1.0 if self.size <= 64 else 0.875)
        self.resize = math.floor(self.size / crop_pct)

    # ---- onto the device
    def to_device(self, images: EncodedBatch | list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        """The batch's JPEGs decoded onto `device` in one call (their bytes on the host, as torchvision asks), the
        images the workers decoded copied there."""
        images = images.images() if isinstance(images, EncodedBatch) else images
        out = [x.to(device, non_blocking=True) if x.dim() == 3 else x for x in images]
        encoded = [i for i, x in enumerate(images) if x.dim() == 1]
        if encoded:
            from torchvision.io import ImageReadMode, decode_jpeg

            mode = ImageReadMode.GRAY if self.channels == 1 else ImageReadMode.RGB
            decoded = decode_jpeg([images[i].cpu() for i in encoded], mode=mode, device=device)
            for i, x in zip(encoded, decoded):
                out[i] = x                                                               # (C, H, W) uint8
        return out

    # ---- on the device
    def __call__(self, images: EncodedBatch | list[torch.Tensor], train: bool) -> torch.Tensor:
        """Decoded (C, H, W) uint8 images (any left encoded are decoded where they are) -> (B, C, S, S) uint8."""
        if isinstance(images, EncodedBatch) or any(x.dim() == 1 for x in images):
            where = images.data.device if isinstance(images, EncodedBatch) else images[0].device
            images = self.to_device(images, where)
        if not train:
            return torch.stack([self.eval_crop(x) for x in images])
        return self.train_batch(images)

    def train_batch(self, images: list[torch.Tensor]) -> torch.Tensor:
        """The training crops of a batch: each image's box drawn and resized on its own, then the rounding, the
        conversion to uint8 and the flips once for the batch (a few kernels per image, not ten)."""
        size = (self.size, self.size)
        crops = []
        for x in images:
            top, left, ch, cw = self.crop_box(*x.shape[-2:])
            crops.append(self._resized(x[:, top:top + ch, left:left + cw], size))              # (C, S, S) float
        out = torch.stack(crops).round_().clamp_(0, 255).to(torch.uint8)                      # (B, C, S, S)
        if self.hflip:
            flip = (torch.rand(len(images)) < self.hflip).to(out.device)                     # (B,) as torchvision draws
            out = torch.where(flip[:, None, None, None], out.flip(-1), out)
        return out

    def crop_box(self, h: int, w: int) -> tuple[int, int, int, int]:
        """timm's RandomResizedCrop draw for an image of h x w: (top, left, height, width)."""
        from timm.data.transforms import RandomResizedCropAndInterpolation

        like = torch.empty((), dtype=torch.uint8).expand(h, w)  # its size is all the draw reads
        return RandomResizedCropAndInterpolation.get_params(like, self.scale, self.ratio)

    def train_crop(self, x: torch.Tensor) -> torch.Tensor:
        """One image's training crop: `train_batch` of one."""
        return self.train_batch([x])[0]

    def eval_crop(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        if min(h, w) != self.resize:  # the shorter side to `resize`, the longer one as torchvision's Resize gives it
            size = (self.resize, int(self.resize * w / h)) if h <= w else (int(self.resize * h / w), self.resize)
            x = self._resize(x, size)
        h, w = x.shape[-2:]
        top, left = int(round((h - self.size) / 2)), int(round((w - self.size) / 2))
        return x[:, top:top + self.size, left:left + self.size]

    def _resize(self, x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        """(C, h, w) uint8 -> (C, *size) uint8, antialiased when it shrinks, rounded as Pillow rounds."""
        if tuple(x.shape[-2:]) == size:
            return x.contiguous()
        return self._resized(x, size).round_().clamp_(0, 255).to(torch.uint8)

    def _resized(self, x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        """(C, h, w) uint8 -> (C, *size) float, not yet rounded."""
        if tuple(x.shape[-2:]) == size:
            return x.float()
        return F.interpolate(x[None].float(), size=size, mode=self.interpolation, align_corners=False,
                             antialias=True)[0]


class DecodeAhead:
    """Training batches decoded and cropped `depth` batches ahead of the step (see the module's docstring): the
    `ahead` stage of the training loader (samplers.ResumableDataLoader), which counts a batch as the step takes it.
    One epoch's thread at a time, started as the step asks for the epoch's first batch (after a resumed loader has
    put back its random state): the previous one is stopped before the workers' iterator starts again. An error in
    the loader or the decoding is raised to the step, where it would have been raised without the thread. The crops
    are drawn on the thread, from the process's random state: a run resumed mid-epoch draws again those of the
    batches that were decoded ahead but not yet taken."""

    _END = object()

    def __init__(self, decoder: DeviceDecoder, device: torch.device, depth: int = 2):
        self.decoder, self.device, self.depth = decoder, torch.device(device), int(depth)
        self._running: tuple[threading.Thread, threading.Event, queue.Queue] | None = None

    def __call__(self, start: Callable[[], Iterator]) -> Iterator[list]:
        return self._taken(start)

    def _work(self, batches: Iterator, q: queue.Queue, stop: threading.Event, stream) -> None:
        def put(item) -> bool:
            while not stop.is_set():
                with contextlib.suppress(queue.Full):
                    q.put(item, timeout=0.1)
                    return True
            return False

        on_cuda = stream is not None
        try:
            with (torch.cuda.device(self.device) if on_cuda else contextlib.nullcontext()), \
                    (torch.cuda.stream(stream) if on_cuda else contextlib.nullcontext()):
                for images, *rest in batches:
                    if stop.is_set():
                        return
                    x = self.decoder(self.decoder.to_device(images, self.device), train=True)   # (B, C, S, S)
                    rest = [t.to(self.device, non_blocking=True) for t in rest]
                    ready = None
                    if on_cuda:
                        ready = torch.cuda.Event()
                        ready.record(stream)
                    if not put((x, rest, ready)):
                        return
        except BaseException as e:  # noqa: BLE001 (raised again in the step's thread)
            put(e)
        else:
            put(self._END)

    def _taken(self, start: Callable[[], Iterator]) -> Iterator[list]:
        self.stop()
        q: queue.Queue = queue.Queue(maxsize=self.depth)
        stop = threading.Event()
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        thread = threading.Thread(target=self._work, args=(start(), q, stop, stream), daemon=True,
                                  name="attnlab-decode-ahead")
        self._running = (thread, stop, q)
        thread.start()
        try:
            while True:
                item = q.get()
                if item is self._END:
                    return
                if isinstance(item, BaseException):
                    raise item
                x, rest, ready = item
                if ready is not None:  # the step's stream waits for the batch; its memory stays the step's
                    current = torch.cuda.current_stream(self.device)
                    current.wait_event(ready)
                    for t in (x, *rest):
                        t.record_stream(current)
                yield [x, *rest]
        finally:
            if self._running is not None and self._running[0] is thread:
                self.stop()

    def stop(self) -> None:
        """Stop the running epoch's thread (a step that took fewer batches than the epoch has) and wait for it."""
        if self._running is None:
            return
        thread, stop, q = self._running
        self._running = None
        stop.set()
        while thread.is_alive():
            with contextlib.suppress(queue.Empty):
                q.get(timeout=0.1)
        thread.join()
