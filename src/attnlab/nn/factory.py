"""The networks attnlab takes from libraries: `timm` (any timm classifier, or a user's own nn.Module by dotted
path) and `encoder_decoder` (a segmentation head of segmentation-models-pytorch over a timm backbone). This is where
configuration meets `nn/`: its errors name the settings to change; the networks themselves know nothing of the
command line."""

from __future__ import annotations

from collections.abc import Callable

import timm
import torch
from torch import nn

import attnlab.nn.timm_compact  # noqa: F401  (registers vit_compact with timm)
from attnlab.errors import UserError
from attnlab.nn.registry import register_network
from attnlab.nn.unet import UNet
from attnlab.types import Fraction, PositiveInt


def check_timm_name(backbone: str, alternative: str = "") -> None:
    if not timm.is_model(backbone):
        close = timm.list_models(f"*{backbone.split('_')[0]}*")[:12]
        raise UserError(
            f"model.backbone={backbone} is not a timm model. Similar names: {', '.join(close) or 'none'}. "
            "List them all with `python -c \"import timm; print(timm.list_models())\"`"
            + (f", {alternative}." if alternative else ".")
        )


def with_img_size(create: Callable, img_size: int | None, name: str, **args) -> tuple[nn.Module, bool]:
    """create(name, img_size=..., **args) for the models built for one input size (ViT, Swin), else without it
    (convnets). -> (network, whether it takes only img_size x img_size inputs)."""
    try:
        return create(name, img_size=img_size, **args), True
    except TypeError as e:
        if "img_size" not in str(e):
            raise
        return create(name, **args), False


def weights_error(backbone: str, e: Exception) -> UserError:
    return UserError(f"could not load pretrained weights for '{backbone}' ({e}). Weights come from the Hugging Face "
                     "hub: go online once (they are cached in ~/.cache/huggingface), or set model.pretrained=false.")


_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict, nn.Identity)


def timm_block_classes(net: nn.Module) -> set[type[nn.Module]]:
    """The block types of a timm network, from timm's own structure: the modules its `group_matcher()` numbers as
    blocks (`blocks.3` of a ViT, `layers.1.blocks.0` of a Swin, `stages.2.blocks.1` of a ConvNeXt, `layer3.4` of a
    ResNet); for a timm feature extractor, which has none (the encoder of `encoder_decoder`), the modules of its
    `blocks` lists. Empty for any other network."""
    import re

    matcher = getattr(net, "group_matcher", None)
    if callable(matcher):
        spec = matcher(coarse=False).get("blocks") or []
        # the patterns timm numbers by their captured indices, not the ones it gives a fixed place (the final norm)
        patterns = [re.compile(p) for p, place in ([(spec, None)] if isinstance(spec, str) else spec)
                    if place is None and re.compile(p).groups]
        found = {type(m) for name, m in net.named_modules() if any(p.fullmatch(name) for p in patterns)}
        return {c for c in found if not issubclass(c, _CONTAINERS)}
    if not type(net).__module__.startswith("timm."):
        return set()
    found: set[type[nn.Module]] = set()
    for name, m in net.named_modules():
        if name.rsplit(".", 1)[-1] == "blocks" and isinstance(m, (nn.Sequential, nn.ModuleList)):
            found |= {type(b) for b in m.modules() if not isinstance(b, _CONTAINERS) and _in_list(m, b)}
    return found


def _in_list(blocks: nn.Module, module: nn.Module) -> bool:
    """Whether `module` is an item of `blocks`, or of a plain list inside it (EfficientNet's stages of blocks)."""
    for child in blocks.children():
        if child is module or (isinstance(child, _CONTAINERS) and _in_list(child, module)):
            return True
    return False


@register_network("timm")
def timm_classifier(backbone: str = "vit_compact", num_classes: PositiveInt = 10, in_chans: PositiveInt = 3,
                    img_size: PositiveInt | None = 224, pretrained: bool = False, backbone_kwargs: dict | None = None,
                    drop_path_rate: Fraction | None = None) -> torch.nn.Module:
    """Any timm model by name (`backbone`), with `num_classes` outputs; or the user's own nn.Module class or
    factory by dotted path (`backbone=mypkg.nets.TinyCNN`). `drop_path_rate` is passed on when given (0.0
    included); None leaves the model's own default."""
    kwargs = dict(backbone_kwargs or {})
    if drop_path_rate is not None:
        kwargs["drop_path_rate"] = drop_path_rate
    return create_backbone(backbone, num_classes, in_chans, img_size, pretrained, **kwargs)


def create_backbone(backbone: str, num_classes: int, in_chans: int, img_size: int | None, pretrained: bool,
                    **kwargs) -> torch.nn.Module:
    """timm.create_model with a clear error for unknown names, arguments a model rejects, and offline weights; or,
    for a dotted path (`mypkg.nets.TinyCNN`), the user's own nn.Module class or factory."""
    if not timm.is_model(backbone) and "." in backbone:
        return _user_backbone(backbone, num_classes, in_chans, img_size, pretrained, **kwargs)
    check_timm_name(backbone, "or give the dotted path of your own nn.Module class or factory "
                              "(model.backbone=mypkg.nets.MyNet)")
    args = dict(num_classes=num_classes, in_chans=in_chans, pretrained=pretrained, **kwargs)
    try:
        net, _ = with_img_size(timm.create_model, img_size, backbone, **args)
        _check_small_input(net, backbone, in_chans, img_size)
        return net
    except TypeError as e:
        raise UserError(
            f"timm model '{backbone}' rejects an argument: {e}. model.backbone_kwargs={kwargs} holds arguments for "
            "another architecture: clear them with `~model.backbone_kwargs` or use `model=timm model.backbone=...`."
        ) from e
    except (OSError, RuntimeError) as e:
        if pretrained:
            raise weights_error(backbone, e) from e
        raise


def _user_backbone(path: str, num_classes: int, in_chans: int, img_size: int | None, pretrained: bool,
                   **kwargs) -> torch.nn.Module:
    """An nn.Module class or factory of the user's, given num_classes and in_chans, img_size where it takes it,
    and model.backbone_kwargs."""
    import inspect

    from hydra.utils import get_object

    try:
        factory = get_object(path)
    except Exception as e:
        raise UserError(
            f"model.backbone={path} is neither a timm model nor an importable class or function ({e.__cause__ or e}). "
            "Check the dotted path; its package must be installed, on PYTHONPATH or in the working directory."
        ) from e
    if pretrained:
        raise UserError(f"model.pretrained=true loads timm's published weights, but model.backbone={path} is your "
                        "own network: set model.pretrained=false (load its weights in its constructor instead).")
    params = inspect.signature(factory).parameters
    takes_any = any(p.kind == p.VAR_KEYWORD for p in params.values())
    args = {"num_classes": num_classes, "in_chans": in_chans, "img_size": img_size}
    args = {k: v for k, v in args.items() if k in params or (takes_any and k != "img_size")}
    missing = [k for k in ("num_classes", "in_chans") if k not in args]
    if missing:
        raise UserError(
            f"model.backbone={path} does not take {' and '.join(missing)}: attnlab passes the number of classes and "
            f"input channels that the data determines. Add {', '.join(f'{k}: int' for k in missing)} to its signature."
        )
    net = factory(**args, **kwargs)
    if not isinstance(net, torch.nn.Module):
        raise UserError(f"model.backbone={path} returned a {type(net).__name__}, not a torch.nn.Module.")
    _check_small_input(net, path, in_chans, img_size)
    return net


def _check_small_input(net: torch.nn.Module, backbone: str, in_chans: int, img_size: int | None) -> None:
    """Images smaller than the backbone was designed for: one dry forward, so that a network whose downsampling
    runs out of pixels (convnext on 8 px digits) says so now instead of failing inside the first training step."""
    designed = (getattr(net, "pretrained_cfg", None) or {}).get("input_size", (0, 0, 0))[-1]
    if not img_size or img_size >= designed:
        return
    try:
        with torch.no_grad():
            net.eval()(torch.zeros(1, in_chans, img_size, img_size))
    except RuntimeError as e:
        raise UserError(
            f"model.backbone={backbone} cannot take {img_size} px images (it was designed for {designed} px; "
            f"{str(e).splitlines()[0]}). Train it on larger images (e.g. data=cifar10 with data.image_size=32 or "
            "more), or pick a backbone for small inputs (model=vit with a small patch size)."
        ) from e
    finally:
        net.train()


@register_network("encoder_decoder")
def encoder_decoder(backbone: str = "resnet18", head: str = "upernet", num_classes: PositiveInt = 2,
                    in_chans: PositiveInt = 3, img_size: PositiveInt = 256, pretrained: bool = False,
                    backbone_kwargs: dict | None = None, head_kwargs: dict | None = None) -> nn.Module:
    """A timm backbone under a segmentation head of segmentation-models-pytorch (upernet, fpn, unet, ...). The
    network carries `input_multiple` (the side its input needs a multiple of) and `fixed_input_size` (whether it
    takes only img_size x img_size inputs, as Swin does)."""
    import segmentation_models_pytorch as smp

    heads = sorted(smp.MODEL_ARCHITECTURES_MAPPING)
    if head.lower() not in heads:
        raise UserError(f"model.head={head} is not a segmentation head: use one of {', '.join(heads)} "
                        "(upernet, fpn and unet are the usual choices).")
    check_timm_name(backbone)
    args = dict(encoder_name=f"tu-{backbone}", encoder_weights="imagenet" if pretrained else None,
                in_channels=in_chans, classes=num_classes, **(head_kwargs or {}), **(backbone_kwargs or {}))
    try:  # transformers (Swin) are built for one input size; convnets take any
        net, fixed = with_img_size(smp.create_model, img_size, head, **args)
        net.input_multiple, net.fixed_input_size = 32, fixed
        return net
    except ValueError as e:
        if "downsampling pattern" in str(e):
            raise UserError(f"model.backbone={backbone} gives no feature pyramid for a segmentation head (plain ViTs "
                            "keep one resolution): use a hierarchical backbone such as swin_tiny_patch4_window7_224, "
                            "convnext_tiny or resnet50.") from e
        raise
    except TypeError as e:
        raise UserError(f"model.head={head} with backbone {backbone} rejects an argument: {e}. Check "
                        "model.head_kwargs and model.backbone_kwargs.") from e
    except (OSError, RuntimeError) as e:
        if pretrained:
            raise weights_error(backbone, e) from e
        raise


@register_network("unet")
def unet(num_classes: PositiveInt = 2, in_chans: PositiveInt = 3, img_size: PositiveInt | None = None,
         base_channels: PositiveInt = 64, depth: PositiveInt = 4, batch_norm: bool = True,
         dropout: Fraction = 0.0) -> UNet:
    """attnlab's U-Net (nn/unet.py) for `in_chans`-channel crops of `img_size` px."""
    if img_size is not None and img_size < 2**depth:
        raise UserError(f"data.image_size={img_size}: a U-Net of model.depth={depth} halves its input {depth} "
                        f"times and needs crops of at least {2**depth} px; raise data.image_size or lower "
                        "model.depth.")
    return UNet(in_chans, num_classes, base_channels, depth, batch_norm, dropout)
