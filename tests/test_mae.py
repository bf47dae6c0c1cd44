"""Masked autoencoders: the network's stages, loading its encoder into timm ViTs, layer decay, linear probes, and
short real pretrain -> fine-tune runs through train()."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import timm
import torch
from PIL import Image

from attnlab.cli.training import train
from attnlab.errors import UserError
from attnlab.nn.mae import MaskedAutoencoderViT
from attnlab.optim import schedulers
from attnlab.optim.param_groups import param_groups
from attnlab.tasks.classification import ImageClassifier
from attnlab.tasks.mae import MAEPretrainer
from attnlab.transfer.mae_vit import MAE_TARGET, load_mae_encoder
from conftest import FAST, compose_cfg

ARCH = dict(embed_dim=32, depth=2, num_heads=2)  # a tiny encoder for unit tests
VIT_KW = dict(patch_size=4, embed_dim=32, depth=2, num_heads=2)


def small_mae(**kw) -> MaskedAutoencoderViT:
    args = dict(img_size=16, patch_size=4, in_chans=3, **ARCH, decoder_dim=16, decoder_depth=1, decoder_heads=2)
    return MaskedAutoencoderViT(**(args | kw))


def vit(img_size=16, **kw):
    return timm.create_model("vit_tiny_patch16_224", img_size=img_size, num_classes=10, **(VIT_KW | kw))


@pytest.fixture
def mae_ckpt(tmp_path) -> tuple[Path, MaskedAutoencoderViT]:
    """A checkpoint as train.py writes it for model=mae (state dict under `net.` + the run's config)."""
    net = small_mae()
    config = {"model": {"_target_": MAE_TARGET, "size": "tiny", **ARCH, "patch_size": 4, "img_size": 16}}
    path = tmp_path / "runs" / "a" / "checkpoints" / "last.ckpt"
    path.parent.mkdir(parents=True)
    torch.save({"state_dict": {f"net.{k}": v for k, v in net.state_dict().items()},
                "attnlab": {"config": config}}, path)
    return path, net


def test_patchify_round_trip_and_layout():
    net = small_mae()
    imgs = torch.randn(2, 3, 16, 16)
    patches = net.patchify(imgs)  # (2, 16, 4*4*3)
    assert patches.shape == (2, 16, 48)
    assert torch.equal(net.unpatchify(patches), imgs)
    # patch 1 is the second patch of the first row; its first pixel is (row 0, col 4) in (p, p, C) order
    assert torch.equal(patches[0, 1, :3], imgs[0, :, 0, 4])


def test_random_masking_keeps_a_quarter_and_ids_restore_unshuffles():
    net = small_mae()
    B, L, D = 3, 16, 5
    x = torch.arange(B * L * D, dtype=torch.float32).reshape(B, L, D)
    kept, mask, ids_restore = net.random_masking(x, 0.75)
    assert kept.shape == (B, L // 4, D) and mask.shape == (B, L)
    assert (mask.sum(1) == L - L // 4).all() and set(mask.unique().tolist()) == {0.0, 1.0}
    for b in range(B):  # the kept tokens are exactly the unmasked ones
        assert sorted(kept[b, :, 0].tolist()) == sorted(x[b][mask[b] == 0][:, 0].tolist())
    # appending the masked tokens and gathering with ids_restore gives back the original order (as the decoder does)
    ids_shuffle = torch.argsort(ids_restore, dim=1)
    shuffled = torch.gather(x, 1, ids_shuffle[..., None].expand(-1, -1, D))
    assert torch.equal(torch.gather(shuffled, 1, ids_restore[..., None].expand(-1, -1, D)), x)
    assert torch.equal(shuffled[:, : L // 4], kept)


def test_loss_only_on_masked_patches_with_normalized_targets():
    net = small_mae()
    imgs = torch.randn(2, 3, 16, 16)
    loss, pred, mask = net(imgs)
    assert loss.ndim == 0 and pred.shape == (2, 16, 48)
    visible = (mask == 0)[..., None]
    changed_visible = pred + 100.0 * visible
    assert torch.allclose(net.forward_loss(imgs, changed_visible, mask), loss)
    changed_masked = pred + 1.0 * (~visible)
    assert not torch.allclose(net.forward_loss(imgs, changed_masked, mask), loss)
    target = net.target(imgs)  # norm_pix_loss: each patch has mean 0, variance 1
    assert torch.allclose(target.mean(-1), torch.zeros(2, 16), atol=1e-5)
    assert torch.allclose(net.forward_loss(imgs, target, mask), torch.tensor(0.0), atol=1e-6)


def test_fixed_sincos_positions_and_no_weight_decay():
    net = small_mae()
    assert not net.pos_embed.requires_grad and not net.decoder_pos_embed.requires_grad
    assert net.pos_embed.shape == (1, 17, 32) and torch.count_nonzero(net.pos_embed[0, 0]) == 0
    assert {"cls_token", "mask_token"} <= net.no_weight_decay()
    with pytest.raises(UserError, match="patch_size=5 does not divide img_size=16"):
        small_mae(patch_size=5)


def test_encoder_keys_load_into_timm_vit(mae_ckpt):
    path, net = mae_ckpt
    for pool in ("token", "avg"):
        model = vit(global_pool=pool)
        head = model.head.weight.clone()
        left = load_mae_encoder(model, str(path), "vit_tiny_patch16_224")
        assert left == ["head.bias", "head.weight"]
        sd = model.state_dict()
        for key in ("patch_embed.proj.weight", "cls_token", "pos_embed", "blocks.1.attn.qkv.weight",
                    "blocks.0.mlp.fc2.bias"):
            assert torch.equal(sd[key], net.state_dict()[key]), key
        norm = "norm" if pool == "token" else "fc_norm"  # timm normalizes after pooling when it averages
        assert torch.equal(sd[f"{norm}.weight"], net.norm.weight)
        assert torch.equal(model.head.weight, head)
    # a folder: its newest checkpoints/last.ckpt
    load_mae_encoder(vit(), str(path.parents[2]))


def test_positional_embedding_is_resampled_to_another_image_size(mae_ckpt):
    from timm.layers import resample_abs_pos_embed

    path, net = mae_ckpt
    model = vit(img_size=32)  # 8x8 patches instead of 4x4
    load_mae_encoder(model, str(path))
    expected = resample_abs_pos_embed(net.pos_embed.data, new_size=[8, 8], num_prefix_tokens=1)
    assert model.pos_embed.shape == (1, 65, 32) and torch.allclose(model.pos_embed, expected)
    assert torch.equal(model.pos_embed[0, 0], net.pos_embed[0, 0])
    model(torch.randn(1, 3, 32, 32))


def test_mismatched_architecture_names_the_keys(mae_ckpt):
    path, _ = mae_ckpt
    with pytest.raises(UserError, match=r"keys of the ViT the checkpoint lacks: blocks\.2\.\*.*embed_dim=32, "
                                        r"depth=2, num_heads=2.*'model.backbone_kwargs=\{embed_dim: 32, depth: 2"):
        load_mae_encoder(vit(depth=3), str(path), "vit_tiny_patch16_224")
    with pytest.raises(UserError, match=r"shapes that differ.*patch_embed.proj.weight \(32, 3, 4, 4\) vs "
                                        r"\(32, 3, 2, 2\)"):
        load_mae_encoder(vit(patch_size=2), str(path))
    with pytest.raises(UserError, match=r"checkpoint the ViT lacks: cls_token"):
        load_mae_encoder(vit(class_token=False, global_pool="avg"), str(path))


def test_non_vit_target_and_non_mae_checkpoints_are_refused(mae_ckpt, tmp_path):
    path, _ = mae_ckpt
    with pytest.raises(UserError, match="model.backbone=resnet18 is a ResNet, not a timm VisionTransformer"):
        ImageClassifier(backbone="resnet18", num_classes=10, img_size=16, init_from=str(path))
    other = tmp_path / "classifier.ckpt"
    torch.save({"state_dict": {}, "attnlab": {"config": {"model": {"_target_": "attnlab.tasks.classification."
                                                                              "ImageClassifier"}}}}, other)
    with pytest.raises(UserError, match="a checkpoint of task attnlab.tasks.classification.ImageClassifier, not of "
                                        "an MAE pretraining run.*ckpt_path="):
        load_mae_encoder(vit(), str(other))
    torch.save({"state_dict": {}}, tmp_path / "foreign.ckpt")
    with pytest.raises(UserError, match="not a checkpoint written by attnlab"):
        load_mae_encoder(vit(), str(tmp_path / "foreign.ckpt"))
    with pytest.raises(UserError, match="nope.ckpt does not exist"):
        load_mae_encoder(vit(), str(tmp_path / "nope.ckpt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no checkpoints/last.ckpt under that folder.*mae_pretrain_cifar10"):
        load_mae_encoder(vit(), str(tmp_path / "empty"))


def test_layer_decay_scales_earlier_blocks_less_and_schedules_keep_the_scales():
    model = vit(depth=3, global_pool="avg")
    groups = param_groups(model, 0.05, layer_decay=0.75)
    names = {id(p): n for n, p in model.named_parameters()}
    scale = {names[id(p)]: g["lr_scale"] for g in groups for p in g["params"]}
    assert len(scale) == len(names)
    assert scale["head.weight"] == scale["fc_norm.weight"] == 1.0
    assert scale["blocks.2.attn.qkv.weight"] == 0.75
    assert scale["blocks.0.attn.qkv.weight"] == pytest.approx(0.75**3)
    assert scale["patch_embed.proj.weight"] == scale["pos_embed"] == pytest.approx(0.75**4)
    token_pooled = vit(depth=3)  # timm numbers its final norm with the last block; it goes with the head
    tp_names = {id(p): n for n, p in token_pooled.named_parameters()}
    tp = {tp_names[id(p)]: g["lr_scale"] for g in param_groups(token_pooled, 0.05, layer_decay=0.75) for p in g["params"]}
    assert tp["norm.weight"] == tp["head.weight"] == 1.0 and tp["blocks.2.attn.qkv.weight"] == 0.75
    decay = {names[id(p)] for g in groups if g["weight_decay"] for p in g["params"]}
    assert "blocks.0.attn.qkv.weight" in decay and "blocks.0.attn.qkv.bias" not in decay and "pos_embed" not in decay

    task = ImageClassifier(backbone="vit_tiny_patch16_224", num_classes=10, img_size=16, backbone_kwargs=VIT_KW,
                           optimizer={"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-3,
                                      "weight_decay": 0.05, "layer_decay": 0.5})
    opt = task.configure_optimizers()  # no schedule configured: the optimizer alone
    lrs = sorted({(g["layer_id"], g["lr"]) for g in opt.param_groups})
    assert [lr for _, lr in lrs] == pytest.approx([1e-3 * 0.5**k for k in (3, 2, 1, 0)])
    sched = schedulers.cosine(opt, total_steps=10, warmup=2)["scheduler"]
    for _ in range(5):
        opt.step()
        sched.step()
    ratio = {g["lr"] / g["lr_scale"] for g in opt.param_groups}
    assert max(ratio) == pytest.approx(min(ratio))  # every layer follows the schedule at its own scale
    with pytest.raises(UserError, match="optimizer.layer_decay needs a network"):
        param_groups(torch.nn.Linear(2, 2), 0.0, layer_decay=0.75)


def test_blr_scales_with_the_effective_batch():
    task = MAEPretrainer(size="tiny", **ARCH, img_size=16, patch_size=4, decoder_dim=16, decoder_depth=1,
                         decoder_heads=2)
    task._trainer = SimpleNamespace(datamodule=SimpleNamespace(batch_size=64), accumulate_grad_batches=2,
                                    world_size=4)
    assert task.lr_from_blr(1.5e-4, None) == pytest.approx(1.5e-4 * 512 / 256)
    with pytest.raises(UserError, match="optimizer.lr=0.001 and optimizer.blr=0.00015 are both set"):
        task.lr_from_blr(1.5e-4, 1e-3)


def test_reconstruction_grid_is_saved_and_sent_to_wandb(tmp_path):
    class WandbLogger:  # the class name is what attnlab.utils.media looks for
        def __init__(self):
            self.logged, self.experiment = [], SimpleNamespace(log=lambda d: self.logged.append(d))

    task = MAEPretrainer(size="tiny", **ARCH, img_size=16, patch_size=4, decoder_dim=16, decoder_depth=1,
                         decoder_heads=2)
    wandb = WandbLogger()
    task._trainer = SimpleNamespace(default_root_dir=str(tmp_path), loggers=[wandb], global_step=30,
                                    current_epoch=2)
    x = torch.randn(3, 3, 16, 16)
    _, pred, mask = task(x, noise=task.fixed_noise(3, 0))
    task._media = (x, pred, mask)
    path = task._save_media()
    assert path == tmp_path / "media" / "val_epoch002_step000030.png"
    assert Image.open(path).size == (3 * 98 + 2, 3 * 98 + 2)
    assert [sorted(d) for d in wandb.logged] == [["trainer/global_step", "val/reconstructions"]]
    # the same images and noise give the same mask: validation is comparable across epochs
    assert torch.equal(task(x, noise=task.fixed_noise(3, 0))[2], mask)


def test_freeze_backbone_trains_only_the_head():
    task = ImageClassifier(backbone="vit_tiny_patch16_224", num_classes=10, img_size=16, backbone_kwargs=VIT_KW,
                           freeze_backbone=True, drop_path_rate=0.1)
    trainable = {n for n, p in task.named_parameters() if p.requires_grad}
    assert trainable == {"net.head.weight", "net.head.bias"}
    assert {id(p) for g in param_groups(task, 0.05) for p in g["params"]} == {id(task.net.head.weight),
                                                                               id(task.net.head.bias)}
    task.train()
    assert task.net.head.training and not task.net.blocks[0].training  # frozen features: no drop path


# ---- real runs through train(): pretrain on digits, then fine-tune from its checkpoint

MAE_RUN = ["model=mae", "data=digits", "model.size=tiny", "model.embed_dim=32", "model.depth=2", "model.num_heads=2",
           "model.decoder_dim=32", "model.decoder_depth=1", "model.decoder_heads=2", "scheduler=cosine",
           "optimizer.lr=null", "optimizer.blr=1.0e-2", "optimizer.betas=[0.9,0.95]", "optimizer.weight_decay=0.05",
           "trainer.max_epochs=4", "trainer.limit_train_batches=12", "trainer.limit_val_batches=2", "test=false",
           "model.media_images=4", *FAST]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mae_pretrain")
    train(compose_cfg(MAE_RUN, out))
    return out


@pytest.mark.slow
def test_pretraining_run_writes_reconstructions_and_its_loss_goes_down(pretrained):
    metrics = json.loads((pretrained / "metrics.json").read_text())
    assert metrics["val/loss_best"] <= metrics["val/loss"] + 1e-6
    df = pd.read_csv(pretrained / "csv" / "metrics.csv")
    val = df.dropna(subset=["val/loss"])["val/loss"].tolist()
    assert len(val) == 4 and val[-1] < 0.95 * val[0], val
    train_loss = df.dropna(subset=["train/loss_epoch"])["train/loss_epoch"].tolist()
    assert train_loss[-1] < train_loss[0]
    media = sorted((pretrained / "media").glob("val_epoch*.png"))
    assert [p.name[:13] for p in media] == [f"val_epoch{i:03d}_" for i in range(4)]
    grid = Image.open(media[-1])
    assert grid.mode == "RGB" and grid.height > grid.width  # 4 rows of original | masked | reconstruction
    ckpt = torch.load(pretrained / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["attnlab"]["config"]["model"]["_target_"] == MAE_TARGET
    assert ckpt["optimizer_states"][0]["param_groups"][0]["lr"] < 1e-2 * 32 / 256  # blr x 32 / 256, cosine-decayed


@pytest.mark.slow
def test_predict_writes_reconstructions(pretrained, tmp_path):
    from attnlab.cli.predict import predict

    src = tmp_path / "images"
    src.mkdir()
    for i in range(3):
        Image.fromarray((torch.rand(8, 8) * 255).byte().numpy(), "L").save(src / f"{i}.png")
    out = predict(compose_cfg([f"ckpt_path={pretrained / 'checkpoints' / 'last.ckpt'}", f"input={src}"],
                              tmp_path / "pred", config_name="predict"))
    assert out == tmp_path / "pred" / "reconstructions.png"
    assert Image.open(out).size == (3 * (96 + 2) + 2, 3 * (96 + 2) + 2)  # 3 images x (original, masked, recon)
    out = predict(compose_cfg([f"ckpt_path={pretrained / 'checkpoints' / 'last.ckpt'}", f"input={src}",
                               "batch_size=2"], tmp_path / "pred2", config_name="predict"))
    assert Image.open(out).size[1] == 2 * (96 + 2) + 2                 # a grid per batch of 2 images
    assert Image.open(tmp_path / "pred2" / "reconstructions_2.png").size[1] == 96 + 2 + 2


@pytest.mark.slow
def test_fine_tune_and_linear_probe_from_the_pretraining_checkpoint(pretrained, tmp_path):
    run = [f"model.init_from={pretrained / 'checkpoints' / 'last.ckpt'}", "data=digits", "trainer.max_epochs=1",
           "trainer.limit_train_batches=4", "trainer.limit_val_batches=2", "test=false", *FAST]
    base = ["model.backbone=vit_tiny_patch16_224", *run] + [
        f"+model.backbone_kwargs.{k}={v}" for k, v in
        dict(patch_size=2, embed_dim=32, depth=2, num_heads=2, global_pool="avg").items()]
    train(compose_cfg([*base, "optimizer.layer_decay=0.75"], tmp_path / "ft"))
    ft = torch.load(tmp_path / "ft" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    scales = sorted({g["lr_scale"] for g in ft["optimizer_states"][0]["param_groups"]})
    assert scales == pytest.approx([0.75**3, 0.75**2, 0.75, 1.0])
    train(compose_cfg([*base, "model.freeze_backbone=true"], tmp_path / "probe"))
    mae = torch.load(pretrained / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    probe = torch.load(tmp_path / "probe" / "checkpoints" / "last.ckpt", map_location="cpu",
                       weights_only=False)["state_dict"]
    assert torch.equal(probe["net.blocks.1.mlp.fc1.weight"], mae["net.blocks.1.mlp.fc1.weight"])  # frozen
    with pytest.raises(UserError, match="keys of the ViT the checkpoint lacks: blocks.2.*"):
        train(compose_cfg([*base, "model.backbone_kwargs.depth=3"], tmp_path / "bad"))
    with pytest.raises(UserError, match="resnet18 is a ResNet"):
        train(compose_cfg(["model.backbone=resnet18", *run], tmp_path / "cnn"))


@pytest.mark.slow
def test_cifar10_experiments_fit_together(tmp_path, small_data):
    """The pretraining experiment's encoder loads into the fine-tuning and scratch experiments' ViT (on the small
    CIFAR-10 PNG zips)."""
    fast = ["data.batch_size=8", "data.num_workers=0", "trainer.max_epochs=1", "trainer.limit_train_batches=1",
            "trainer.limit_val_batches=1", *FAST]
    train(compose_cfg(["experiment=mae_pretrain_cifar10", *fast], tmp_path / "pre", data_dir=small_data))
    cfg = compose_cfg(["experiment=mae_finetune_cifar10", "debug=fdr", *fast], tmp_path / "ft", data_dir=small_data)
    assert cfg.model.init_from.endswith("mae_pretrain_cifar10") and cfg.optimizer.layer_decay == 0.75
    cfg.model.init_from = str(tmp_path / "pre")  # the newest run under the folder, as with logs/mae_pretrain_cifar10
    train(cfg)
    cfg = compose_cfg(["experiment=vit_scratch_cifar10", "debug=fdr", *fast], tmp_path / "scratch", data_dir=small_data)
    assert cfg.model.init_from is None and cfg.optimizer.layer_decay is None
    assert (cfg.optimizer.lr, cfg.model.drop_path_rate) == (1e-3, 0.1)  # a random start's better lr and drop path
    assert cfg.model.backbone_kwargs == compose_cfg(["experiment=mae_finetune_cifar10"], tmp_path).model.backbone_kwargs
    train(cfg)


def test_imagenet_recipe_composes_and_stops_at_the_missing_files(tmp_path):
    cfg = compose_cfg(["experiment=mae_pretrain_imagenet", "debug=fdr", *FAST], tmp_path)
    assert (cfg.model.size, cfg.model.patch_size, cfg.model.mask_ratio) == ("base", 16, 0.75)
    assert cfg.optimizer.blr == 1.5e-4 and list(cfg.optimizer.betas) == [0.9, 0.95] and cfg.global_batch_size == 4096
    assert list(cfg.data.augment.scale) == [0.2, 1.0] and cfg.data.augment.auto_augment is None
    with pytest.raises(UserError, match="ImageNet-1k not found"):
        train(cfg)
