"""Segmentation building blocks: joint transforms, mIoU, U-Net shapes, sliding windows, and the bad-input errors."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch
import wandb
from PIL import Image
from torch import nn
from torchmetrics.classification import MulticlassConfusionMatrix, MulticlassJaccardIndex

from attnlab.cli.predict import predictor_for
from attnlab.data.segmentation import transforms as T
from attnlab.data.segmentation.datamodule import MembraneDataModule, SegFolderDataModule
from attnlab.errors import UserError
from attnlab.nn.unet import UNet
from attnlab.tasks.segmentation import Segmenter, iou_from_confusion, pad_forward, sliding_window
from attnlab.utils.media import denormalize

# ---- joint transforms


def _pair(h: int = 60, w: int = 80, classes: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """A mask of 10x10 px blocks of classes 0..classes-1 and an image whose 3 channels spell the class out:
    channel 0 = class / 10, channels 1 and 2 = the pixel's row and column (to follow geometry)."""
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, classes, (h // 10 + 1, w // 10 + 1), generator=g)
    mask = blocks.repeat_interleave(10, 0).repeat_interleave(10, 1)[:h, :w]
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    image = torch.stack([mask.float() / 10, rows.float(), cols.float()])
    return image, mask


@pytest.mark.parametrize("augment", [
    {"crop": "random", "hflip": 1.0, "vflip": 1.0},       # pure geometry: alignment must be exact
    {"crop": "random", "hflip": 0.5},                     # crops larger than the image: padding
])
def test_crops_and_flips_keep_image_and_mask_exactly_aligned(augment):
    image, mask = _pair()
    t = T.train_pair_transform(96, mean=[0, 0, 0], std=[1, 1, 1], augment=augment)
    for seed in range(20):
        torch.manual_seed(seed)
        x, y = t(image, mask)
        assert x.shape == (3, 96, 96) and y.shape == (96, 96) and y.dtype == torch.long
        pad = y == T.IGNORE_INDEX
        assert pad.any()  # the 60x80 image is padded to 96x96 ...
        assert (x[:, pad] == 0).all()  # ... the image with 0 where the mask is ignored
        labelled = ~pad
        assert torch.equal((x[0][labelled] * 10).round().long(), y[labelled])  # same class under every pixel
        # each output pixel carries its source row and column: the mask there is the source mask's label
        r, c = x[1][labelled].long(), x[2][labelled].long()
        assert torch.equal(y[labelled], mask[r, c])
        # and neighbours stay neighbours: a crop and flips move the grid as a whole
        for i in range(96):
            src_rows, src_cols = x[1, i][labelled[i]], x[2, i][labelled[i]]
            if len(src_rows):
                assert (src_rows == src_rows[0]).all() and (src_cols.diff().abs() == 1).all()


@pytest.mark.parametrize("augment", [
    {"crop": "random", "scale": [0.5, 2.0], "hflip": 0.5},
    {"crop": "resized", "scale": [0.1, 1.0], "hflip": 0.5, "vflip": 0.5},
    {"resize": 48, "crop": "random", "scale": [0.7, 1.3]},
    {"elastic": {"p": 1.0, "std": 6, "grid": 3}, "crop": "random", "hflip": 0.5},
])
def test_resizing_transforms_keep_labels_in_the_class_set_and_aligned(augment):
    image, mask = _pair(120, 160)
    t = T.train_pair_transform(64, mean=[0, 0, 0], std=[1, 1, 1], augment=augment)
    for seed in range(20):
        torch.manual_seed(seed)
        x, y = t(image, mask)
        assert x.shape == (3, 64, 64) and y.shape == (64, 64)
        assert set(y.unique().tolist()) <= {0, 1, 2, 3, T.IGNORE_INDEX}  # nearest: never a blend of labels
        labelled = y != T.IGNORE_INDEX
        # the image's row/column channels (bilinear) say where each pixel came from; the mask (nearest) holds the
        # source mask's label there, up to sub-pixel rounding at block borders
        r = (x[1][labelled] + 0.5).floor().long().clamp(0, 119)
        c = (x[2][labelled] + 0.5).floor().long().clamp(0, 159)
        agree = (mask[r, c] == y[labelled]).float().mean()
        assert agree > 0.95, (seed, float(agree))


def test_elastic_deformation_bends_the_grid_and_keeps_the_mask_on_the_image():
    image, mask = _pair(240, 320)
    t = T.train_pair_transform(120, mean=[0, 0, 0], std=[1, 1, 1], augment={"elastic": {"p": 1.0, "std": 8}})
    torch.manual_seed(0)
    x, y = t(image, mask)
    assert x.shape == (3, 120, 120) and not (y == T.IGNORE_INDEX).any()  # the margin covers the displacements
    rows = x[1]  # the source row of each output pixel
    # not a rigid move: the source row varies along an output row, smoothly (neighbours move together)
    assert (rows.max(1).values - rows.min(1).values).mean() > 1.0
    assert rows.diff(dim=1).abs().max() < 1.5
    assert set(y.unique().tolist()) <= {0, 1, 2, 3, T.IGNORE_INDEX}
    torch.manual_seed(0)
    same = T.RandomElastic(p=0.0)(image, mask)  # p=0: the pair unchanged
    assert torch.equal(same[0], image) and torch.equal(same[1], mask)


@pytest.mark.parametrize("augment, says", [
    ({"elastc": {"p": 0.5}}, "data.augment.elastc is not a segmentation augmentation"),
    ({"elastic": {"p": 0.5, "sigma": 3}}, "data.augment.elastic="),
    ({"crop": "center"}, "data.augment.crop=center"),
])
def test_augment_keys_are_checked(augment, says):
    with pytest.raises(UserError, match=says):
        T.check_augment(augment)


def test_eval_resize_keeps_mask_values():
    image, mask = _pair(60, 80)
    x, y = T.eval_pair_transform([0, 0, 0], [1, 1, 1], resize=45)(image, mask)
    assert y.shape == (45, 60) and x.shape == (3, 45, 60)
    assert set(y.unique().tolist()) <= set(mask.unique().tolist())


# ---- metrics


def test_miou_equals_the_hand_computation():
    target = torch.tensor([[[0, 0, 1], [1, 2, 255]]])
    pred = torch.tensor([[[0, 1, 1], [1, 0, 2]]])
    cm = MulticlassConfusionMatrix(4, ignore_index=255, validate_args=False)
    cm.update(pred, target)
    iou, miou, acc = iou_from_confusion(cm.compute())
    # labelled pixels (truth, prediction): (0,0) (0,1) (1,1) (1,1) (2,0); the pixel labelled 255 is ignored
    # class 0: tp 1, fp 1 (the 2 read as 0), fn 1 -> 1/3;  class 1: tp 2, fp 1, fn 0 -> 2/3
    # class 2: tp 0, fn 1 -> 0;  class 3: in neither truth nor prediction -> left out of the mean
    assert iou[:3].tolist() == pytest.approx([1 / 3, 2 / 3, 0.0])
    assert torch.isnan(iou[3])
    assert float(miou) == pytest.approx((1 / 3 + 2 / 3 + 0) / 3)
    assert float(acc) == pytest.approx(3 / 5)
    # torchmetrics' own Jaccard index agrees on the classes present
    jac = MulticlassJaccardIndex(4, ignore_index=255, average="none")(pred, target)
    assert jac[:3].tolist() == pytest.approx(iou[:3].tolist())


def test_rand_error_counts_merged_and_split_cells():
    from attnlab.tasks.seg_metrics import RandError, adapted_rand_error

    # two 4x4 cells (class 1) separated by a membrane column (class 0)
    truth = torch.ones(4, 9, dtype=torch.long)
    truth[:, 4] = 0
    metric = RandError(object_class=1)
    metric.update(truth[None], truth[None])
    assert float(metric.compute()) == 0.0  # perfect
    merged = torch.ones(4, 9, dtype=torch.long)  # the membrane missed: one cell
    metric.update(merged[None], truth[None])
    # pairs of the 32 cell pixels: truth has 2 x 16^2 - 32 = 480 ordered same-object pairs, the merge 32^2 - 32 = 992,
    # both agree on 480: precision 480/992, recall 1 -> error 1 - 2pr/(p+r)
    p = 480 / 992
    assert float(metric.compute()) == pytest.approx((0 + 1 - 2 * p / (p + 1)) / 2)
    # a split is an error too, and the order of truth and prediction does not matter for the score
    t = np.array([[1, 1, 1, 1]]), np.array([[1, 1, 2, 2]])
    split = adapted_rand_error(*t)
    assert split > 0 and split == pytest.approx(adapted_rand_error(*t[::-1]))
    # pixels ignored in the truth are left out
    ignored = truth.clone()
    ignored[:, :4] = 255
    metric.reset()
    metric.update(merged[None], ignored[None])
    assert float(metric.compute()) == 0.0


def test_border_weights_stress_the_gaps_between_nearly_touching_cells():
    from attnlab.tasks.seg_weights import border_weights

    # membrane (0) with two 10x10 cells (1) 3 px apart, a third cell far off, an ignored corner
    mask = np.zeros((40, 60), np.int64)
    mask[5:15, 5:15] = mask[5:15, 18:28] = mask[25:35, 45:55] = 1
    mask[-3:, :3] = 255
    w = border_weights(mask, objects=1, w0=10, sigma=5, balance=False)
    # the middle of the gap is 2 px from each cell: 1 + 10 exp(-(2 + 2)^2 / 50)
    assert w[10, 16] == pytest.approx(1 + 10 * np.exp(-16 / 50), rel=1e-5)
    assert w[10, 16] > 7 * w[38, 30]  # against membrane far from any pair of cells
    assert (w[mask == 1] == 1).all() and (w[mask == 255] == 0).all()  # cells get no border term; ignored: nothing
    # balance: each class weighs as much in total, the mean weight over labelled pixels is 1
    wc = border_weights(mask, objects=1, w0=0, balance=True)
    assert wc[mask == 0].sum() == pytest.approx(wc[mask == 1].sum()) and wc[mask != 255].mean() == pytest.approx(1)


def test_border_weights_equal_the_formula_with_every_cell_measured_over_the_whole_image():
    from scipy import ndimage

    from attnlab.tasks.seg_weights import border_weights

    # 60 random cells: membrane between them, many nearly touching
    rng = np.random.default_rng(0)
    mask = np.zeros((96, 128), np.int64)
    for top, left, h, w in zip(rng.integers(0, 90, 60), rng.integers(0, 120, 60), rng.integers(3, 12, 60),
                               rng.integers(3, 12, 60)):
        mask[top:top + h, left:left + w] = 1
    cells, n = ndimage.label(mask == 1)
    assert n > 10
    dist = np.sort(np.stack([ndimage.distance_transform_edt(cells != i) for i in range(1, n + 1)]), axis=0)
    expected = 1 + np.where(cells == 0, 10 * np.exp(-((dist[0] + dist[1]) ** 2) / 50), 0)
    got = border_weights(mask, objects=1, w0=10, sigma=5, balance=False)
    # cells further than the cut-off contribute under w0 / 1000
    np.testing.assert_allclose(got, expected, atol=10 / 1000 + 1e-5)
    assert (expected > 3).sum() > 100  # the comparison covers many stressed pixels


@pytest.mark.parametrize("setting, says", [
    ({"objects": "cell", "w": 10}, r"border_weight=.*give \{objects: cell, w0: 10, sigma: 5, balance: true\}"),
    ({"w0": 10}, r"border_weight=.*the keys being objects"),
    ({"objects": "nucleus"}, r"border_weight.objects=nucleus is not a class: .* \(membrane, cell\)"),
    ({"objects": 1, "sigma": 0}, r"sigma=0 must be numbers"),
    ({"objects": 1, "w0": "ten"}, r"w0=ten and sigma=5.0 must be numbers"),
])
def test_border_weight_settings_are_checked(setting, says):
    with pytest.raises(UserError, match=says):
        Segmenter(arch="unet", num_classes=2, in_chans=1, img_size=32, base_channels=4, depth=2,
                  class_names=["membrane", "cell"], border_weight=setting)


def test_border_weights_missing_from_the_batch_are_an_error_naming_the_data_module():
    class OwnHook(L.LightningDataModule):
        def on_before_batch_transfer(self, batch, dataloader_idx):  # Lightning then skips the model's
            return batch

    model = Segmenter(arch="unet", num_classes=2, in_chans=1, img_size=32, base_channels=4, depth=2,
                      class_names=["membrane", "cell"], border_weight={"objects": "cell"})
    model._trainer = SimpleNamespace(datamodule=OwnHook())
    batch = torch.zeros(2, 1, 32, 32), torch.ones(2, 32, 32, dtype=torch.long)
    with pytest.raises(UserError, match=r"came without their weights: the data module \(OwnHook\) overrides"):
        model.training_step(batch, 0)


# ---- networks and inference


@pytest.mark.parametrize("size", [(37, 45), (16, 16), (33, 64), (101, 17)])
def test_unet_output_has_the_input_size(size):
    net = UNet(in_channels=3, num_classes=5, base_channels=4, depth=4)
    y = net(torch.randn(2, 3, *size))  # odd sizes included
    assert y.shape == (2, 5, *size)


def test_unet_refuses_images_smaller_than_its_poolings():
    with pytest.raises(ValueError, match="at least 16 px"):
        UNet(1, 2, base_channels=4, depth=4)(torch.randn(1, 1, 12, 40))


def test_sliding_window_equals_a_full_forward():
    torch.manual_seed(0)
    pointwise = nn.Conv2d(3, 4, kernel_size=1)  # every window sees the same pixels as the full image
    x = torch.randn(2, 3, 100, 130)
    with torch.no_grad():
        full = pointwise(x)
        for window, overlap in [(64, 0.5), (64, 0.0), (32, 1 / 3), (100, 0.25)]:
            assert torch.allclose(sliding_window(pointwise, x, window, overlap), full, atol=1e-6)
        small = x[..., :20, :50]  # smaller than the window: padded, then cut back
        assert torch.allclose(sliding_window(pointwise, small, 64), pointwise(small), atol=1e-6)
    # a U-Net whose window is the whole image: one tile, the full forward exactly
    net = UNet(3, 4, base_channels=4, depth=3).eval()
    x = torch.randn(1, 3, 48, 48)
    with torch.no_grad():
        assert torch.equal(sliding_window(net, x, 48), net(x))
        assert torch.equal(pad_forward(net, x, 16), net(x))


def test_segmenter_slides_only_over_images_larger_than_the_crop():
    model = Segmenter(arch="unet", num_classes=3, in_chans=1, img_size=32, base_channels=4, depth=3).eval()
    calls = []
    model.net.register_forward_hook(lambda m, i, o: calls.append(tuple(i[0].shape[-2:])))
    with torch.no_grad():
        assert model.infer(torch.randn(1, 1, 32, 32)).shape == (1, 3, 32, 32)
        assert calls == [(32, 32)]
        calls.clear()
        assert model.infer(torch.randn(1, 1, 70, 50)).shape == (1, 3, 70, 50)
        assert calls and set(calls) == {(32, 32)}  # tiles of the crop size only


def test_tta_averages_the_probabilities_of_the_flipped_views():
    torch.manual_seed(0)
    model = Segmenter(arch="unet", num_classes=3, in_chans=1, img_size=32, base_channels=4, depth=2,
                      tta="flips").eval()
    x = torch.randn(2, 1, 32, 40)
    with torch.no_grad():
        views = [model._infer_view(x.flip(d)).softmax(1).flip(d) for d in [(), (-1,), (-2,), (-2, -1)]]
        assert torch.allclose(model.infer(x).exp(), sum(views) / 4, atol=1e-6)
        assert torch.allclose(model.infer(x.flip(-1)), model.infer(x).flip(-1), atol=1e-5)  # flip-equivariant
        model.hparams.tta = "none"
        assert torch.allclose(model.infer(x).softmax(1), views[0], atol=1e-6)


def test_timm_backbone_under_each_head():
    for head in ("upernet", "fpn", "unet"):
        model = Segmenter(arch="encoder_decoder", backbone="resnet18", head=head, num_classes=3, in_chans=1,
                          img_size=64).eval()
        with torch.no_grad():
            assert model.infer(torch.randn(1, 1, 96, 80)).shape == (1, 3, 96, 80)
    with pytest.raises(UserError, match="not a timm model"):
        Segmenter(arch="encoder_decoder", backbone="resnet_nope", num_classes=3)
    with pytest.raises(UserError, match="not a segmentation head"):
        Segmenter(arch="encoder_decoder", backbone="resnet18", head="nohead", num_classes=3)
    with pytest.raises(UserError, match="multiple of 32"):
        Segmenter(arch="encoder_decoder", backbone="resnet18", head="fpn", num_classes=3, img_size=100)


def test_swin_position_tables_get_no_weight_decay():
    from attnlab.optim.param_groups import param_groups

    model = Segmenter(arch="encoder_decoder", backbone="swin_tiny_patch4_window7_224", head="upernet",
                      num_classes=3, img_size=64, backbone_kwargs={"depths": [1, 1, 1, 1], "embed_dim": 24,
                                                                   "num_heads": [1, 1, 1, 1], "window_size": 2})
    decayed, undecayed = param_groups(model, 0.05)
    tables = {id(p) for n, p in model.named_parameters() if n.endswith("relative_position_bias_table")}
    assert len(tables) == 4 and tables <= {id(p) for p in undecayed["params"]}
    assert not tables & {id(p) for p in decayed["params"]}


def test_predict_runs_at_the_evaluation_scale_and_writes_masks_at_the_image_size(tmp_path):
    from omegaconf import OmegaConf

    model = Segmenter(arch="unet", num_classes=3, in_chans=3, img_size=16, base_channels=4, depth=2,
                      mean=[0.5] * 3, std=[0.5] * 3).eval()
    seen = []
    infer = model.infer
    model.infer = lambda x: seen.append(tuple(x.shape[-2:])) or infer(x)
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 30, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    (out,) = predictor_for(type(model))(model, OmegaConf.create({"input": str(tmp_path / "a.png")}),
                               OmegaConf.create({"data": {"eval_resize": 15}}))
    assert seen == [(20, 15)] and Image.open(out).size == (30, 40)  # evaluated at 15 px short side, saved at 30x40


def test_settings_the_segmenter_cannot_honour_are_refused():
    with pytest.raises(UserError, match=r"model.ignore_index=0: the data marks unlabeled pixels .* data.label_map"):
        Segmenter(arch="unet", num_classes=3, in_chans=1, img_size=64, base_channels=4, ignore_index=0)
    with pytest.raises(UserError, match=r"data.image_size=8: a U-Net of model.depth=4 .* at least 16 px"):
        Segmenter(arch="unet", num_classes=3, in_chans=1, img_size=8, base_channels=4, depth=4)


# ---- data: the ISBI slices and bad folders


def test_membrane_split_and_labels(small_data):
    root = small_data / "isbi2012_em_membrane"  # 30 slices of 256x256 in the ISBI layout
    dm = MembraneDataModule(root=str(root), image_size=128, samples_per_epoch=30)
    dm.setup()
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (30, 5, 5)
    assert dm.info().sizes() == {"num_classes": 2, "image_size": 128, "channels": 1}
    x, y = dm.val_set[0]
    assert x.shape == (1, 256, 256) and y.shape == (256, 256)
    raw = np.asarray(Image.open(root / "label" / "25.png"))
    assert torch.equal(y, torch.from_numpy((raw == 255).astype(np.int64)))  # 255 cell -> 1, 0 membrane -> 0
    x, y = dm.train_set[0]
    assert x.shape == (1, 128, 128) and set(y.unique().tolist()) <= {0, 1}


def _folder(root: Path, n: int = 4, size=(24, 20), mode: str = "RGB", values=(0, 1, 2)) -> Path:
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    rng = np.random.default_rng(0)
    for i in range(n):
        shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
        Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8), mode).save(root / "images" / f"im{i}.jpg")
        mask = rng.choice(np.array(values, dtype=np.uint8), (size[1], size[0]))
        Image.fromarray(mask, "L").save(root / "masks" / f"im{i}.png")
    return root


def _dm(root: Path, **kwargs) -> SegFolderDataModule:
    dm = SegFolderDataModule(**({"root": str(root), "classes": ["a", "b", "c"], "image_size": 16,
                                 "val_fraction": 0.25, "batch_size": 2} | kwargs))
    dm.setup()
    return dm


def test_folder_of_pairs_loads(tmp_path):
    dm = _dm(_folder(tmp_path / "ok"))
    assert len(dm.train_set) == 3 and len(dm.val_set) == 1
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (2, 3, 16, 16) and y.shape == (2, 16, 16)


def test_image_and_mask_counts_must_match(tmp_path):
    root = _folder(tmp_path / "d")
    (root / "masks" / "im3.png").unlink()
    with pytest.raises(UserError, match=r"4 images .* but 3 masks .* images without a mask: im3.*Add the missing"):
        _dm(root)


def test_image_and_mask_sizes_must_match(tmp_path):
    root = _folder(tmp_path / "d")
    Image.fromarray(np.zeros((20, 23), np.uint8)).save(root / "masks" / "im2.png")
    with pytest.raises(UserError, match=r"im2.jpg and mask .*im2.png differ in size: image 24x20, mask 23x20.*"
                                        r"re-export it at the image's size"):
        _dm(root)


def test_mask_values_outside_the_class_list(tmp_path):
    root = _folder(tmp_path / "d", values=(0, 1, 7))
    with pytest.raises(UserError, match=r"masks.im\d.png holds values outside the class list: 7 .*data.label_map"):
        _dm(root)
    dm = _dm(root, label_map={7: 2})  # the fix the message names
    assert set(dm.val_set[0][1].unique().tolist()) <= {0, 1, 2}
    lazily = _dm(root, label_map=None, check_files=False)  # found when the pair is read, if not checked up front
    with pytest.raises(UserError, match="outside the class list: 7"):
        lazily.train_set[0]


def test_grayscale_and_rgb_must_match_data_channels(tmp_path):
    with pytest.raises(UserError, match=r"colour \(RGB\) \(PIL mode RGB\) but data.channels=1\. Set data.channels=3"):
        _dm(_folder(tmp_path / "rgb"), channels=1, mean=[0.5], std=[0.5])
    with pytest.raises(UserError, match=r"is grayscale \(PIL mode L\) but data.channels=3\. Set data.channels=1"):
        _dm(_folder(tmp_path / "gray", mode="L"))


def test_colour_masks_and_missing_folders_are_refused(tmp_path):
    root = _folder(tmp_path / "d")
    Image.new("RGB", (24, 20)).save(root / "masks" / "im1.png")
    with pytest.raises(UserError, match="PIL mode RGB image: masks must be single-channel"):
        _dm(root)
    with pytest.raises(UserError, match="does not exist"):
        _dm(tmp_path / "nowhere")
    with pytest.raises(UserError, match="needs its class list"):
        _dm(_folder(tmp_path / "e"), classes=None)


# ---- validation pictures


class WandbLogger:  # stands in for Lightning's (the task recognizes it by name) and records what is logged
    def __init__(self):
        self.logged: list[dict] = []
        self.experiment = self

    def log(self, data: dict) -> None:
        self.logged.append(data)


def test_overlay_grid_is_saved_under_the_run_dir_and_sent_to_wandb(tmp_path):
    model = Segmenter(arch="unet", num_classes=3, in_chans=1, img_size=32, base_channels=4, depth=3,
                      palette=[[0, 0, 0], [255, 0, 0], [0, 0, 255]])
    wb = WandbLogger()
    model._trainer = SimpleNamespace(loggers=[wb], default_root_dir=str(tmp_path), current_epoch=2, global_step=30)
    truth = np.zeros((40, 60), np.int64)
    truth[:, 30:] = 1
    pred = np.full((40, 60), 2)
    image = denormalize(torch.zeros(1, 40, 60), [0.5], [0.5])  # mid-gray
    model._media = [(image, truth, pred)] * 2
    model._save_media()
    grid = np.asarray(Image.open(tmp_path / "media" / "val_epoch002_step000030.png"))
    # 2 rows of image | truth | prediction, 256 px high, 2 px of white between and around them
    assert grid.shape == (2 * 258 + 2, 3 * 386 + 2, 3) and (grid[0, 0] == 255).all()
    assert (grid[10, 10] == [128, 128, 128]).all()  # the image
    assert (grid[10, 388 + 10] == [64, 64, 64]).all() and (grid[10, 388 + 300] == [192, 64, 64]).all()  # truth
    assert (grid[10, 774 + 10] == [64, 64, 192]).all()  # prediction: class 2 over the image
    assert wb.logged[0]["trainer/global_step"] == 30 and isinstance(wb.logged[0]["val/overlays"], wandb.Image)
