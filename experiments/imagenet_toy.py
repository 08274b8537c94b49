"""ImageNet-classification toy check (SoftmaxGRPO paper, Fig. 2; DESIGN.md §6; docs/results.md).

Classification as one-step RL: the classifier pi(y|x) is the policy; per image M labels y_i ~
pi(.|x), reward R_i = 1 for the true label, advantages from `softmax_grpo.group_advantages`, and

    loss_RL = -(1 / (B*M)) * sum_{b,i} A_{b,i} * log pi(y_{b,i} | x_b)          (one-step policy gradient)

against cross-entropy as the reference; only the gradient estimator differs between runs. Defaults
are the paper's (SGD lr 0.1, momentum 0.9, weight decay 1e-4, 10% warm-up then cosine, tau 0.2, M up
to 1024); the policy starts uniform (zero last layer). Data: a synthetic 1000-class problem
(Gaussian clusters, 32-d, one-hidden-layer MLP) or `--features FILE` (.pt dict/tuple or .npz with
`features` [N, D], `labels` [N]).

Run:  python -m experiments.imagenet_toy                      (~4 CPU-minutes, one thread)
Writes <output-dir>/curves.csv (per eval: top1, pass@1 = E[pi(y*|x)], pass@128, entropy,
train_reward), final.csv (the last rows plus wall_s and cpu_s) and curves.png (with matplotlib).
"""

import argparse
import math
import os
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from experiments import pyplot, write_csv, write_figure
from softmax_grpo import METHODS, group_advantages


@dataclass
class ToyData:
    train_x: torch.Tensor  # [N_train, D] float32
    train_y: torch.Tensor  # [N_train] int64
    test_x: torch.Tensor  # [N_test, D] float32
    test_y: torch.Tensor  # [N_test] int64
    num_classes: int
    description: str


DEFAULT_LR = {"sgd": 0.1, "adam": 3e-4}  # one lr per optimizer, shared by every method
PASS_K = 128  # the paper reports pass@128 next to pass@1


@dataclass
class ToyConfig:
    methods: tuple = ("ce", "reinforce", "grpo", "maxrl", "softmax")
    group_sizes: tuple = (16, 64, 256, 1024)  # the paper samples 1024 labels per image
    tau: float = 0.2  # the paper's ImageNet setting
    steps: int = 2000
    batch_size: int = 128
    optimizer: str = "sgd"  # the official one: momentum 0.9, weight decay 1e-4 (make_optimizer)
    lr: float = None  # None = DEFAULT_LR[optimizer]
    schedule: str = "cosine"  # linear warm-up over warmup_fraction of the steps, then cosine to 0; or "constant"
    warmup_fraction: float = 0.1  # official: 2 of 20 epochs
    hidden: int = 256  # 0 = linear head
    eval_every: int = 100
    seed: int = 0

    def __post_init__(self):
        if self.lr is None:
            self.lr = DEFAULT_LR[self.optimizer]


def make_synthetic(num_classes=1000, dim=32, train_per_class=50, test_per_class=10, noise=1.0, seed=0):
    """Gaussian clusters x = mu_y + noise * eps, mu_c, eps ~ N(0, I_D) (they overlap: cross-entropy ~0.9, not 1)."""
    gen = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(num_classes, dim, generator=gen)

    def draw(per_class):
        y = torch.arange(num_classes).repeat_interleave(per_class)
        x = prototypes[y] + noise * torch.randn(len(y), dim, generator=gen)
        return x, y

    train_x, train_y = draw(train_per_class)
    test_x, test_y = draw(test_per_class)
    desc = f"synthetic: {num_classes} classes, D={dim}, noise={noise}, {train_per_class}/{test_per_class} per class"
    return ToyData(train_x, train_y, test_x, test_y, num_classes, desc)


def load_features(path, test_fraction=0.2, seed=0):
    """Real features from `.pt` (dict or tuple) or `.npz`; standardised with train statistics."""
    if not os.path.exists(path):
        raise ValueError(f"--features: file not found: {path}")
    if path.endswith(".npz"):
        arrays = np.load(path)
        if "features" not in arrays or "labels" not in arrays:
            raise ValueError(f"{path}: an .npz needs arrays 'features' and 'labels', found {list(arrays.keys())}")
        features, labels = torch.from_numpy(arrays["features"]), torch.from_numpy(arrays["labels"])
    elif path.endswith(".pt"):
        obj = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(obj, dict) and "features" in obj and "labels" in obj:
            features, labels = obj["features"], obj["labels"]
        elif isinstance(obj, (tuple, list)) and len(obj) == 2:
            features, labels = obj
        else:
            raise ValueError(f"{path}: expected a dict with 'features' and 'labels' or a (features, labels) tuple")
        features, labels = torch.as_tensor(features), torch.as_tensor(labels)
    else:
        raise ValueError(f"--features: {path}: expected a .pt or .npz file")
    features, labels = features.float().reshape(len(features), -1), labels.long().reshape(-1)
    if len(features) != len(labels) or len(labels) < 2:
        raise ValueError(f"{path}: {len(features)} feature rows but {len(labels)} labels")
    if labels.min() < 0:
        raise ValueError(f"{path}: labels must be non-negative class indices")
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_test = max(1, int(round(test_fraction * len(labels))))
    test_idx, train_idx = order[:n_test], order[n_test:]
    if len(train_idx) < 2:
        raise ValueError(f"{path}: only {len(train_idx)} training rows left after holding out --test-fraction")
    mean, std = features[train_idx].mean(0), features[train_idx].std(0) + 1e-6
    features = (features - mean) / std
    num_classes = int(labels.max()) + 1
    desc = f"{path}: {len(train_idx)} train / {n_test} test, D={features.shape[1]}, {num_classes} classes"
    return ToyData(features[train_idx], labels[train_idx], features[test_idx], labels[test_idx], num_classes, desc)


def build_policy(dim, num_classes, hidden, seed):
    """MLP (or linear head when hidden = 0) whose last layer is zero: the initial policy is exactly uniform."""
    torch.manual_seed(seed)
    if hidden > 0:
        policy = torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, num_classes))
    else:
        policy = torch.nn.Sequential(torch.nn.Linear(dim, num_classes))
    torch.nn.init.zeros_(policy[-1].weight)
    torch.nn.init.zeros_(policy[-1].bias)
    return policy


def one_step_rl_loss(logits, labels, method, num_samples, tau, generator):
    """loss = -(1/(B*M)) sum A_{b,i} log pi(y_{b,i}|x_b); logits [B, C], labels [B] -> (loss, mean reward).
    Its expected gradient is -omega(p) * grad p, p = pi(y*|x) (Eq. 4)."""
    logprobs = F.log_softmax(logits, dim=-1)  # [B, C]
    samples = torch.multinomial(logprobs.detach().exp(), num_samples, replacement=True, generator=generator)  # [B, M]
    rewards = (samples == labels[:, None]).float()  # [B, M]
    advantages = group_advantages(rewards, method, tau=tau)  # [B, M], no gradient
    sample_logprobs = logprobs.gather(1, samples)  # [B, M]
    loss = -(advantages * sample_logprobs).mean()
    return loss, rewards.mean().item()


def make_optimizer(parameters, name, lr):
    """The paper's SGD (momentum 0.9, weight decay 1e-4, on every parameter) or plain Adam (no weight decay)."""
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=lr, momentum=0.9, weight_decay=1e-4)
    if name == "adam":
        return torch.optim.Adam(parameters, lr=lr)
    raise ValueError(f"--optimizer: unknown optimizer '{name}'; choose sgd or adam")


def lr_factor(step, warmup_steps, total_steps):
    """lr multiplier of update `step` (0-based): step / warmup, then 0.5 * (1 + cos(pi * t)),
    t = (step - warmup) / (total - warmup), as the official script (first lr 0); 0 from total."""
    if step < warmup_steps:
        return step / warmup_steps
    if step >= total_steps:
        return 0.0
    return 0.5 * (1.0 + math.cos(math.pi * (step - warmup_steps) / (total_steps - warmup_steps)))


def pass_at_k(p, k):
    """Exact pass@k = 1 - (1 - p)^k = -expm1(k * log1p(-p)); p [N] -> [N] float64."""
    return -torch.expm1(k * torch.log1p(-p.double()))


def metric_sums(logprobs, labels):
    """Batch sums of top-1 (greedy), pass@1 = pi(y*|x), pass@PASS_K and entropy (nats); logprobs [N, C], labels [N]."""
    p = logprobs.gather(1, labels[:, None]).squeeze(1).exp()  # [N]
    return {"top1": (logprobs.argmax(-1) == labels).sum().item(), "pass@1": p.double().sum().item(),
            f"pass@{PASS_K}": pass_at_k(p, PASS_K).sum().item(),
            "entropy": -(logprobs.exp() * logprobs).sum().item()}


@torch.no_grad()
def evaluate(policy, x, y, chunk=4096):
    """Held-out means of metric_sums: {"top1", "pass@1", "pass@128", "entropy"}."""
    totals = {}
    for start in range(0, len(y), chunk):
        sums = metric_sums(F.log_softmax(policy(x[start:start + chunk]), -1), y[start:start + chunk])
        totals = {key: totals.get(key, 0.0) + value for key, value in sums.items()}
    return {key: value / len(y) for key, value in totals.items()}


def train_one(data, method, num_samples, cfg):
    """Train one policy; returns the learning curve as a list of dict rows."""
    policy = build_policy(data.train_x.shape[1], data.num_classes, cfg.hidden, cfg.seed)  # same init for all
    optimizer = make_optimizer(policy.parameters(), cfg.optimizer, cfg.lr)
    warmup_steps = round(cfg.warmup_fraction * cfg.steps) if cfg.schedule == "cosine" else 0
    data_gen = torch.Generator().manual_seed(cfg.seed)  # same data order for all methods
    sample_gen = torch.Generator().manual_seed(cfg.seed + 1)
    n_train, order, position = len(data.train_y), None, len(data.train_y)
    rows, recent_rewards, lr = [], [], 0.0
    for step in range(cfg.steps + 1):
        if step % cfg.eval_every == 0 or step == cfg.steps:
            train_reward = sum(recent_rewards) / len(recent_rewards) if recent_rewards else ""
            rows.append(dict(step=step, method=method, M=num_samples if method != "ce" else "", tau=cfg.tau
                             if method == "softmax" else "", lr=lr, **evaluate(policy, data.test_x, data.test_y),
                             train_reward=train_reward))
            recent_rewards = []
        if step == cfg.steps:
            break
        if position + cfg.batch_size > n_train:  # new epoch: fresh permutation
            order, position = torch.randperm(n_train, generator=data_gen), 0
        batch = order[position:position + cfg.batch_size]
        position += cfg.batch_size
        lr = cfg.lr * (lr_factor(step, warmup_steps, cfg.steps) if cfg.schedule == "cosine" else 1.0)
        for group in optimizer.param_groups:
            group["lr"] = lr
        logits = policy(data.train_x[batch])
        if method == "ce":
            loss = F.cross_entropy(logits, data.train_y[batch])
        else:
            loss, reward = one_step_rl_loss(logits, data.train_y[batch], method, num_samples, cfg.tau, sample_gen)
            recent_rewards.append(reward)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return rows


def run(data, cfg, output_dir, log=print):
    """All (method, M) runs; writes curves.csv, final.csv and curves.png; returns the final rows."""
    os.makedirs(output_dir, exist_ok=True)
    curves, finals = [], []
    for method in cfg.methods:
        for num_samples in ([None] if method == "ce" else cfg.group_sizes):
            start, start_cpu = time.time(), time.process_time()
            rows = train_one(data, method, num_samples, cfg)
            wall, cpu = time.time() - start, time.process_time() - start_cpu  # CPU time: robust on a shared machine
            curves += rows
            finals.append(dict(rows[-1], wall_s=round(wall, 2), cpu_s=round(cpu, 2)))
            log(f"  {method:>9s} M={num_samples or '-':>4}: top-1 {rows[-1]['top1']:.3f} pass@1 "
                f"{rows[-1]['pass@1']:.3f} pass@{PASS_K} {rows[-1][f'pass@{PASS_K}']:.3f} ({wall:.1f}s, "
                f"CPU {cpu:.1f}s)")
    write_csv(os.path.join(output_dir, "curves.csv"), curves)
    write_csv(os.path.join(output_dir, "final.csv"), finals)
    plot_curves(curves, cfg, os.path.join(output_dir, "curves.png"), log)
    return finals


def format_table(finals, cfg):
    """Markdown table, one row per method and one column per M (cross-entropy does not sample: same value in
    each); a cell is "top-1 / pass@1 / pass@128"."""
    header = "| method | " + " | ".join(f"M={m}" for m in cfg.group_sizes) + " |"
    lines = [header, "|---" * (len(cfg.group_sizes) + 1) + "|"]
    for method in cfg.methods:
        cells = []
        for m in cfg.group_sizes:
            match = [r for r in finals if r["method"] == method and r["M"] in ("", m)]
            cells.append(" / ".join(f"{match[0][key]:.3f}" for key in ("top1", "pass@1", f"pass@{PASS_K}"))
                         if match else "")
        name = f"softmax (tau={cfg.tau})" if method == "softmax" else method
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_curves(curves, cfg, path, log=print):
    plt = pyplot("curves.png; curves.csv has the data", log)
    if plt is None:
        return
    fig, axes = plt.subplots(2, len(cfg.group_sizes), figsize=(5 * len(cfg.group_sizes), 7), squeeze=False)
    for column, m in enumerate(cfg.group_sizes):
        for row, (key, name) in enumerate((("top1", "held-out top-1"), ("pass@1", "held-out pass@1 = E[pi(y*|x)]"))):
            ax = axes[row][column]
            for method in cfg.methods:
                rows = [r for r in curves if r["method"] == method and r["M"] in ("", m)]
                style = dict(color="black", linestyle="--") if method == "ce" else {}
                label = "cross-entropy" if method == "ce" else method + (f" (tau={cfg.tau})" * (method == "softmax"))
                ax.plot([r["step"] for r in rows], [r[key] for r in rows], label=label, **style)
            ax.set_title(f"M = {m} sampled labels per image")
            ax.set_xlabel("step")
            ax.set_ylabel(name)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    write_figure(fig, path, dpi=120)
    plt.close(fig)
    log(f"wrote {path}")


def parse_args(argv=None):
    d = ToyConfig()
    p = argparse.ArgumentParser(description="ImageNet-classification toy check: classification as one-step RL.")
    p.add_argument("--methods", default=",".join(d.methods), help="comma list of ce and group_advantages methods")
    p.add_argument("--group-sizes", default=",".join(map(str, d.group_sizes)), help="comma list of M")
    p.add_argument("--tau", type=float, default=d.tau, help="SoftmaxGRPO temperature (paper: 0.2 on ImageNet)")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--optimizer", choices=("sgd", "adam"), default=d.optimizer,
                   help="sgd: momentum 0.9, weight decay 1e-4 (the paper's); adam: plain Adam")
    p.add_argument("--lr", type=float, default=None,
                   help="one learning rate for every method (default: 0.1 for sgd, 3e-4 for adam)")
    p.add_argument("--schedule", choices=("cosine", "constant"), default=d.schedule,
                   help="cosine: linear warm-up over --warmup-fraction of the steps, then cosine decay to 0")
    p.add_argument("--warmup-fraction", type=float, default=d.warmup_fraction)
    p.add_argument("--hidden", type=int, default=d.hidden, help="MLP hidden width; 0 = linear head")
    p.add_argument("--eval-every", type=int, default=d.eval_every)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--features", default=None, help=".pt or .npz with features [N, D] and labels [N]")
    p.add_argument("--test-fraction", type=float, default=0.2, help="held-out share of --features")
    p.add_argument("--classes", type=int, default=1000, help="synthetic: number of classes")
    p.add_argument("--dim", type=int, default=32, help="synthetic: feature dimension")
    p.add_argument("--noise", type=float, default=1.0, help="synthetic: noise std around each prototype")
    p.add_argument("--train-per-class", type=int, default=50)
    p.add_argument("--test-per-class", type=int, default=10)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is fastest for these small matmuls)")
    p.add_argument("--output-dir", default="runs/imagenet_toy")
    args = p.parse_args(argv)
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    for m in methods:
        if m != "ce" and m not in METHODS:
            p.error(f"--methods: unknown method '{m}'; choose from ce, {', '.join(METHODS)}")
    try:
        group_sizes = tuple(int(m) for m in args.group_sizes.split(",") if m.strip())
    except ValueError:
        p.error(f"--group-sizes: expected comma-separated integers, got '{args.group_sizes}'")
    if not group_sizes or min(group_sizes) < 2:
        p.error("--group-sizes: every M must be >= 2")
    if not args.tau > 0 or (args.lr is not None and not args.lr > 0):
        p.error("--tau and --lr must be > 0")
    if not 0 <= args.warmup_fraction < 1:
        p.error("--warmup-fraction must lie in [0, 1)")
    if not 0 < args.test_fraction < 1:
        p.error("--test-fraction must lie in (0, 1)")
    for name in ("steps", "batch_size", "eval_every", "classes", "dim", "train_per_class", "test_per_class"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    cfg = ToyConfig(methods, group_sizes, args.tau, args.steps, args.batch_size, args.optimizer, args.lr,
                    args.schedule, args.warmup_fraction, args.hidden, args.eval_every, args.seed)
    return args, cfg


def main(argv=None):
    args, cfg = parse_args(argv)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        if args.features:
            try:
                data = load_features(args.features, args.test_fraction, args.seed)
            except ValueError as error:
                raise SystemExit(f"imagenet_toy.py: error: {error}") from None
        else:
            data = make_synthetic(args.classes, args.dim, args.train_per_class, args.test_per_class, args.noise,
                                  args.seed)
        print(f"data: {data.description}; initial success rate 1/{data.num_classes} = {1 / data.num_classes:.4f}")
        schedule = f"{cfg.warmup_fraction:g} warm-up then cosine" if cfg.schedule == "cosine" else "constant"
        print(f"{cfg.steps} steps x {cfg.batch_size} images, {cfg.optimizer} lr={cfg.lr:g} ({schedule}), "
              f"seed={cfg.seed}")
        start, start_cpu = time.time(), time.process_time()
        finals = run(data, cfg, args.output_dir)
        print(f"\nHeld-out top-1 / pass@1 / pass@{PASS_K} after {cfg.steps} steps ({time.time() - start:.0f}s "
              f"wall, {time.process_time() - start_cpu:.0f}s CPU in all):")
        print(format_table(finals, cfg))
        print(f"learning curves: {os.path.join(args.output_dir, 'curves.csv')}")
        return finals
    finally:
        torch.set_num_threads(previous_threads)  # main() is also called from tests: leave the process as it was


if __name__ == "__main__":
    main()
