"""The real-ImageNet path (experiments/imagenet_real.py) on a tiny ImageFolder written here: 3 classes of random
40x40 images, resnet18 at 32x32, 2 updates per epoch. Skipped when torchvision cannot be imported.
"""

import math
import os

import pytest
import torch

try:  # a torchvision built for another torch raises RuntimeError at import, not ImportError
    import torchvision
    from torchvision import datasets  # noqa: F401
except Exception as error:
    pytest.skip(f"torchvision is not usable here ({type(error).__name__}: {error}); the real-ImageNet path needs it",
                allow_module_level=True)
Image = pytest.importorskip("PIL.Image", reason="Pillow writes the test's images")

from experiments import imagenet_real  # noqa: E402

CLASSES = ("n01440764", "n01443537", "n01484850")  # folder names as in ImageNet; any names work


def write_image_folder(root, train_per_class=4, val_per_class=2, size=40, classes=CLASSES):
    gen = torch.Generator().manual_seed(0)
    for split, count in (("train", train_per_class), ("val", val_per_class)):
        for index, name in enumerate(classes):
            os.makedirs(root / split / name, exist_ok=True)
            for i in range(count):  # random pixels with a per-class tint, so the classes differ a little
                pixels = torch.randint(0, 200, (size, size, 3), generator=gen, dtype=torch.uint8)
                pixels[..., index % 3] += 55
                Image.fromarray(pixels.numpy()).save(root / split / name / f"{name}_{i}.png")
    return root


def small_run(data_dir, output_dir, *extra):
    """12 training images / batch 6 = 2 updates per epoch; 6 validation images."""
    return ["--data-dir", str(data_dir), "--arch", "resnet18", "--image-size", "32", "--batch-size", "6",
            "--group-size", "8", "--workers", "0", "--device", "cpu", "--output-dir", str(output_dir), *extra]


def test_two_steps_train_and_report_the_papers_metrics(tmp_path, one_thread):
    data_dir = write_image_folder(tmp_path / "data")
    rows = imagenet_real.main(small_run(data_dir, tmp_path / "out", "--epochs", "1", "--warmup-epochs", "0"))
    assert [(row["epoch"], row["step"]) for row in rows] == [(0, 0), (1, 2)]
    for row in rows:  # 6 validation images: top-1 is a multiple of 1/6; pass@1 <= pass@128 <= 1
        assert row["top1"] * 6 == pytest.approx(round(row["top1"] * 6))
        assert 0 < row["pass@1"] <= row["pass@128"] <= 1
    # the lr of the last update: no warm-up, cosine over 2 updates -> 0.1 * 0.5 * (1 + cos(pi / 2)) = 0.05
    assert rows[-1]["lr"] == pytest.approx(0.05)
    assert rows[-1]["method"] == "softmax" and rows[-1]["M"] == 8 and rows[-1]["tau"] == 0.2
    assert 0 <= rows[-1]["train_reward"] <= 1
    assert (tmp_path / "out" / "curves.csv").read_text().splitlines()[0].startswith(
        "epoch,step,method,M,tau,lr,top1,pass@1,pass@128,entropy")
    assert (tmp_path / "out" / "final.csv").exists()
    # the two RL updates changed the classifier: the checkpoint differs from the seed-0 initial network
    state = torch.load(tmp_path / "out" / "checkpoint.pt", weights_only=True)
    torch.manual_seed(0)
    initial = torchvision.models.get_model("resnet18", weights=None, num_classes=3)
    assert not torch.equal(state["model"]["fc.weight"], initial.fc.weight)
    assert state["next_epoch"] == 1


def test_resume_at_an_epoch_boundary_matches_an_uninterrupted_run(tmp_path, one_thread):
    data_dir = write_image_folder(tmp_path / "data")
    common = ("--epochs", "2", "--warmup-epochs", "1", "--method", "grpo")
    straight = imagenet_real.main(small_run(data_dir, tmp_path / "a", *common))
    first = imagenet_real.main(small_run(data_dir, tmp_path / "b", *common, "--stop-after", "1"))
    assert [row["epoch"] for row in first] == [0, 1]
    resumed = imagenet_real.main(small_run(data_dir, tmp_path / "b", *common,
                                           "--resume", str(tmp_path / "b" / "checkpoint.pt")))
    drop_wall = [{key: value for key, value in row.items() if key != "wall_s"} for row in straight]
    assert [{key: value for key, value in row.items() if key != "wall_s"} for row in resumed] == drop_wall
    assert math.isfinite(resumed[-1]["pass@1"])
    with pytest.raises(SystemExit, match="has method='grpo', this run 'softmax'"):
        imagenet_real.main(small_run(data_dir, tmp_path / "c", "--epochs", "2", "--warmup-epochs", "1",
                                     "--resume", str(tmp_path / "b" / "checkpoint.pt")))
    with pytest.raises(SystemExit, match="--arch: unknown torchvision model 'resnet7'"):
        imagenet_real.main(small_run(data_dir, tmp_path / "c", "--arch", "resnet7"))


def test_bad_input_is_one_line(tmp_path):
    data_dir = write_image_folder(tmp_path / "data", train_per_class=1, val_per_class=1)
    os.makedirs(data_dir / "val" / "extra_class")
    Image.new("RGB", (8, 8)).save(data_dir / "val" / "extra_class" / "x.png")
    with pytest.raises(SystemExit, match="different class folders.*extra_class"):
        imagenet_real.main(small_run(data_dir, tmp_path / "out"))
    with pytest.raises(SystemExit, match=r"missing[/\\]train is not a folder"):
        imagenet_real.main(small_run(tmp_path / "missing", tmp_path / "out"))
    with pytest.raises(SystemExit):  # argparse: unknown method
        imagenet_real.parse_args(["--data-dir", str(data_dir), "--method", "nonsense"])
    with pytest.raises(SystemExit):
        imagenet_real.parse_args(["--data-dir", str(data_dir), "--warmup-epochs", "20"])
