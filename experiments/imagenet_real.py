"""Real ImageNet, as the SoftmaxGRPO paper's Fig. 2 ran it: a torchvision ResNet as the policy.

imagenet_toy.py's one-step RL loss, optimizer, lr schedule and metrics (imported) on images from
DIR/train/<class>/ and DIR/val/<class>/ (torchvision's ImageFolder, the official augmentations).
Official settings are the defaults: ResNet-50 from scratch, SGD lr 0.1, batch 256, 20 epochs with 2
of warm-up then cosine, M = 1024, tau = 0.2. After every epoch: val/ metrics,
<output-dir>/checkpoint.pt (`--resume` continues with the same data order and samples; `--stop-after
N` ends an invocation after N epochs), curves.csv and final.csv. torchvision is optional
(docs/results.md, "Real ImageNet").

Run:  python -m experiments.imagenet_real --data-dir /data/imagenet                       (softmax, M = 1024)
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F

from experiments import output_file, write_csv
from experiments.imagenet_toy import DEFAULT_LR, PASS_K, lr_factor, make_optimizer, metric_sums, one_step_rl_loss
from softmax_grpo import METHODS

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# settings a resumed run must share with its checkpoint (they fix the schedule, the data and the estimator)
RESUME_KEYS = ("arch", "method", "group_size", "tau", "optimizer", "lr", "batch_size", "epochs",
               "warmup_epochs", "image_size", "seed")


def import_torchvision():
    """torchvision, or a one-line SystemExit saying how to get it (it is optional for the rest of the project)."""
    try:
        import torchvision
        from torchvision import datasets, transforms  # noqa: F401  (fails here when the install is broken)
    except Exception as error:  # a torchvision built for another torch raises RuntimeError, not ImportError
        raise SystemExit(f"imagenet_real.py: error: --data-dir needs torchvision, installed for your torch "
                         f"(pip install torchvision): {type(error).__name__}: {error}") from None
    return torchvision


def build_loaders(torchvision, data_dir, image_size, batch_size, workers, pin_memory, shuffle_gen):
    """ImageFolder train/val loaders with the official augmentations; returns (train_loader, val_loader, classes)."""
    from torchvision import datasets, transforms
    normalize = transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    train_transform = transforms.Compose([transforms.RandomResizedCrop(image_size), transforms.RandomHorizontalFlip(),
                                          transforms.ToTensor(), normalize])
    val_transform = transforms.Compose([transforms.Resize(round(image_size * 256 / 224)),
                                        transforms.CenterCrop(image_size), transforms.ToTensor(), normalize])
    folders = {}
    for split, transform in (("train", train_transform), ("val", val_transform)):
        path = os.path.join(data_dir, split)
        if not os.path.isdir(path):
            raise ValueError(f"--data-dir: {path} is not a folder (expected {split}/<class>/<image> files)")
        try:
            folders[split] = datasets.ImageFolder(path, transform=transform)
        except (FileNotFoundError, RuntimeError) as error:  # no class folders, or class folders without images
            raise ValueError(f"--data-dir: {path}: {error}") from None
    if folders["train"].classes != folders["val"].classes:
        only = sorted(set(folders["train"].classes) ^ set(folders["val"].classes))[:5]
        raise ValueError(f"--data-dir: train/ and val/ have different class folders (e.g. {', '.join(only)})")
    train_loader = torch.utils.data.DataLoader(folders["train"], batch_size=batch_size, shuffle=True,
                                               generator=shuffle_gen, num_workers=workers, pin_memory=pin_memory)
    val_loader = torch.utils.data.DataLoader(folders["val"], batch_size=batch_size, num_workers=workers,
                                             pin_memory=pin_memory)
    return train_loader, val_loader, folders["train"].classes


@torch.no_grad()
def evaluate(model, loader, device):
    """Means over the loader of metric_sums: {"top1", "pass@1", "pass@128", "entropy"}."""
    model.eval()
    totals, count = {}, 0
    for images, labels in loader:
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        sums = metric_sums(F.log_softmax(model(images).float(), -1), labels)
        totals = {key: totals.get(key, 0.0) + value for key, value in sums.items()}
        count += len(labels)
    model.train()
    return {key: value / count for key, value in totals.items()}


def save_checkpoint(path, **state):
    with output_file(path, "wb") as f:  # written beside and renamed: a run killed while saving keeps the previous
        torch.save(state, f)


def train(args, log=print):
    """Train one (method, M) run; returns the rows (one per epoch)."""
    torchvision = import_torchvision()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.backends.cudnn.benchmark = device.type == "cuda"  # fixed input size: let cuDNN pick its fastest kernels
    config = {key: getattr(args, key) for key in RESUME_KEYS}
    torch.manual_seed(args.seed)  # the initial weights and, with --workers 0, the augmentations
    shuffle_gen = torch.Generator()
    train_loader, val_loader, classes = build_loaders(torchvision, args.data_dir, args.image_size, args.batch_size,
                                                      args.workers, device.type == "cuda", shuffle_gen)
    try:
        model = torchvision.models.get_model(args.arch, weights=None, num_classes=len(classes)).to(device)
    except ValueError:
        raise ValueError(f"--arch: unknown torchvision model '{args.arch}' (e.g. resnet18, resnet50)") from None
    optimizer = make_optimizer(model.parameters(), args.optimizer, args.lr)
    sample_gen = torch.Generator(device=device).manual_seed(args.seed + 1)  # the M sampled labels
    steps_per_epoch = len(train_loader)
    total_steps, warmup_steps = args.epochs * steps_per_epoch, args.warmup_epochs * steps_per_epoch
    rows, start_epoch = [], 0
    if args.resume:
        state = torch.load(args.resume, map_location="cpu", weights_only=True)
        for key in RESUME_KEYS:
            if state["config"][key] != config[key]:
                raise ValueError(f"--resume: {args.resume} has {key}={state['config'][key]!r}, "
                                 f"this run {config[key]!r}")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["cpu_rng"])
        if device.type == "cuda":
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        sample_gen.set_state(state["sample_rng"])
        rows, start_epoch = state["rows"], state["next_epoch"]
    os.makedirs(args.output_dir, exist_ok=True)
    M = args.group_size if args.method != "ce" else ""
    log(f"{args.arch} on {device}, {len(classes)} classes, {steps_per_epoch} steps/epoch x {args.batch_size} images; "
        f"{args.method} M={M or '-'}; {args.optimizer} lr={args.lr:g}; epochs {start_epoch}..{args.epochs}")

    def record(epoch, step, lr, rewards, started):
        metrics = evaluate(model, val_loader, device)
        rows.append(dict(epoch=epoch, step=step, method=args.method, M=M, tau=args.tau if args.method == "softmax"
                         else "", lr=lr, **metrics, train_reward=sum(rewards) / len(rewards) if rewards else "",
                         wall_s=round(time.time() - started, 1)))
        write_csv(os.path.join(args.output_dir, "curves.csv"), rows)
        log(f"epoch {epoch}: top-1 {metrics['top1']:.4f} pass@1 {metrics['pass@1']:.4f} "
            f"pass@{PASS_K} {metrics[f'pass@{PASS_K}']:.4f} ({rows[-1]['wall_s']}s)")

    if not rows:
        record(0, 0, 0.0, [], time.time())
    last_epoch = min(args.epochs, start_epoch + args.stop_after) if args.stop_after else args.epochs
    model.train()
    for epoch in range(start_epoch, last_epoch):
        started, rewards = time.time(), []
        shuffle_gen.manual_seed(args.seed * 100_003 + epoch)  # the order depends on the epoch only: resumable
        for index, (images, labels) in enumerate(train_loader):
            step = epoch * steps_per_epoch + index
            lr = args.lr * lr_factor(step, warmup_steps, total_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            logits = model(images).float()
            if args.method == "ce":
                loss = F.cross_entropy(logits, labels)
            else:
                loss, reward = one_step_rl_loss(logits, labels, args.method, args.group_size, args.tau, sample_gen)
                rewards.append(reward)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        record(epoch + 1, step + 1, lr, rewards, started)
        save_checkpoint(os.path.join(args.output_dir, "checkpoint.pt"), model=model.state_dict(),
                        optimizer=optimizer.state_dict(), cpu_rng=torch.get_rng_state(),
                        cuda_rng=torch.cuda.get_rng_state_all() if device.type == "cuda" else [],
                        sample_rng=sample_gen.get_state(), rows=rows, next_epoch=epoch + 1, config=config)
    write_csv(os.path.join(args.output_dir, "final.csv"), rows[-1:])
    if last_epoch < args.epochs:
        log(f"stopped after epoch {last_epoch}; continue with "
            f"--resume {os.path.join(args.output_dir, 'checkpoint.pt')}")
    return rows


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="ImageNet classification as one-step RL with a torchvision ResNet.")
    p.add_argument("--data-dir", required=True, help="folder with train/<class>/ and val/<class>/ images")
    p.add_argument("--arch", default="resnet50", help="torchvision model name, e.g. resnet18, resnet50")
    p.add_argument("--method", default="softmax", help=f"ce or one of {', '.join(METHODS)}")
    p.add_argument("--group-size", type=int, default=1024, help="M sampled labels per image")
    p.add_argument("--tau", type=float, default=0.2, help="SoftmaxGRPO temperature (paper: 0.2)")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    p.add_argument("--lr", type=float, default=None, help="default: 0.1 for sgd, 3e-4 for adam")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--warmup-epochs", type=int, default=2, help="linear warm-up, then cosine decay to 0")
    p.add_argument("--image-size", type=int, default=224, help="crop size (validation resizes to size * 256/224)")
    p.add_argument("--workers", type=int, default=4, help="DataLoader worker processes")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", default=None, metavar="FILE", help="checkpoint.pt of an earlier run")
    p.add_argument("--stop-after", type=int, default=0, help="end this invocation after N epochs (0 = run all)")
    p.add_argument("--output-dir", default="runs/imagenet")
    args = p.parse_args(argv)
    if args.method != "ce" and args.method not in METHODS:
        p.error(f"--method: unknown method '{args.method}'; choose from ce, {', '.join(METHODS)}")
    if args.group_size < 2:
        p.error("--group-size must be >= 2")
    if not args.tau > 0:
        p.error("--tau must be > 0")
    for name in ("batch_size", "epochs", "image_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 <= args.warmup_epochs < args.epochs:
        p.error("--warmup-epochs must lie in [0, --epochs)")
    if args.workers < 0 or args.stop_after < 0:
        p.error("--workers and --stop-after must be >= 0")
    if args.resume and not os.path.isfile(args.resume):
        p.error(f"--resume: file not found: {args.resume}")
    args.lr = DEFAULT_LR[args.optimizer] if args.lr is None else args.lr
    if not args.lr > 0:
        p.error("--lr must be > 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        return train(args)
    except ValueError as error:
        raise SystemExit(f"imagenet_real.py: error: {error}") from None


if __name__ == "__main__":
    main()
