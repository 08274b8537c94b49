"""Lopti paper (Yang et al., arXiv 2505.12929) Fig. 1(d) and Fig. 3 on rollouts of one checkpoint.

The tokens with a gradient (rows with A != 0), grouped by p_old (--groups: quartiles or fixed
ranges). Fig. 1(d): per group the logit-level gradient norm |A| * ||onehot(o) - softmax(z)||
(--param-grad: also the parameter-gradient norm). Fig. 3: from the same rollouts and weights, one
update each for GRPO, AR, Lopti and AR+Lopti, then per group the share of A > 0 tokens whose
probability rose and of A < 0 tokens whose probability fell.

    python -m experiments.lopti_token_stats --checkpoint runs/default/latest                  # tiny, CPU, ~1 min
    python -m experiments.lopti_token_stats --task countdown --task-option num_count=3 --seeds 0,1,2,3,4 \\
        --checkpoint runs/compare/countdown3-lopti/grpo-seed{seed}/latest    # each seed's run, Fig. 3 over seeds

Writes <output-dir>/fig1d_grad_norm.csv and fig3_prob_rise.csv (one row per seed and group),
fig3_prob_rise_summary.csv (mean, sample std and SE over seeds) and, with matplotlib, the two PNGs.
"""
import argparse
import copy
import csv
import math
import os
import statistics

import torch

import train
from harness.config import Config
from experiments import mean_sd_se, output_file, pyplot, write_figure
from experiments.table3_allocation import add_checkpoint_arguments, load_for_experiment, sample_groups
from rollout import token_logprobs
from softmax_grpo import METHODS, group_advantages

UPDATES = {"grpo": dict(alpha=0.0, eta=0.0), "ar": dict(alpha=0.3, eta=0.0),  # Fig. 3's four variants
           "lopti": dict(alpha=0.0, eta=0.5), "ar+lopti": dict(alpha=0.3, eta=0.5)}
NUM_GROUPS = 4


@torch.no_grad()
def logit_gradient_norms(model, input_ids, attention_mask, completion_mask, *, temperature=1.0, micro_batch=64):
    """norms [B, T] = ||onehot(o_t) - softmax(z_t / temperature)|| of every completion token."""
    width = completion_mask.shape[1]
    norm_chunks = []
    for start in range(0, input_ids.shape[0], micro_batch):
        ids, mask = input_ids[start:start + micro_batch], attention_mask[start:start + micro_batch]
        position_ids = (mask.long().cumsum(dim=1) - 1).clamp(min=0)  # as rollout.token_logprobs
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=False,
                       logits_to_keep=width + 1).logits[:, :-1, :].float() / temperature
        probs = torch.softmax(logits, dim=-1)                                        # [b, T, V]
        token_probs = probs.gather(-1, ids[:, -width:, None]).squeeze(-1)            # [b, T]
        norm_chunks.append((1.0 - 2.0 * token_probs + (probs ** 2).sum(-1)).clamp_min(0.0).sqrt())
    return torch.cat(norm_chunks)


def probability_groups(old_probs, token_mask, how="quantile"):
    """old_probs, token_mask [B, T] -> group index [B, T] long in 0..3 (-1 outside token_mask):
    `how` quantile (4 equal-count parts by p_old, stable sort) or fixed ([0,.25) .. [.75,1])."""
    groups = torch.full(old_probs.shape, -1, dtype=torch.long)
    mask = token_mask.bool()
    values = old_probs[mask]
    if how == "fixed":
        groups[mask] = (values * NUM_GROUPS).long().clamp(max=NUM_GROUPS - 1)
    elif how == "quantile":
        order = torch.argsort(values, stable=True)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(len(order))
        groups[mask] = rank * NUM_GROUPS // max(len(order), 1)
    else:
        raise ValueError(f"--groups must be 'quantile' or 'fixed', got {how!r}")
    return groups


def param_grad_norms(model, batch, advantages, groups, *, total_tokens, temperature, micro_batch):
    input_ids, attention_mask, completion_mask = batch
    params = [p for p in model.parameters() if p.requires_grad]
    norms = []
    for q in range(NUM_GROUPS):
        grads = [torch.zeros_like(p) for p in params]
        for start in range(0, input_ids.shape[0], micro_batch):
            rows = slice(start, start + micro_batch)
            in_group = (groups[rows] == q).float()
            if not in_group.any():
                continue
            logprobs = token_logprobs(model, input_ids[rows], attention_mask[rows], completion_mask[rows],
                                      temperature=temperature)
            objective = (advantages[rows, None] * logprobs * in_group).sum() / total_tokens
            for acc, g in zip(grads, torch.autograd.grad(objective, params, allow_unused=True)):
                if g is not None:
                    acc += g
        norms.append(torch.sqrt(sum((g.float() ** 2).sum() for g in grads)).item())
    return norms


def one_update(model, batch, advantages, old_logprobs, *, alpha, eta, lr, temperature=1.0, clip_low=0.2,
               clip_high=0.28, weight_decay=0.01, grad_clip=1.0, micro_batch=64, optimizer="adamw"):
    """train.update_batch (one PPO epoch, no KL, fp32) on `model` in place, pi_old = old_logprobs"""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay) if optimizer == "adamw" \
        else torch.optim.SGD(model.parameters(), lr=lr)
    config = Config(alpha=alpha, lopti_eta=eta, temperature=temperature, clip_low=clip_low, clip_high=clip_high,
                    grad_clip=grad_clip, micro_batch=micro_batch, dtype="fp32")
    model.train()
    train.update_batch(model, optimizer, *batch, advantages, config, old_logprobs=old_logprobs)
    return model


def rise_rows(method, old_logprobs, new_logprobs, advantages, groups):
    def mean_over(values, mask):
        return values[mask].float().mean().item() if mask.any() else math.nan

    rows = []
    sign = advantages[:, None].expand_as(groups)
    delta = new_logprobs - old_logprobs
    for q in range(NUM_GROUPS):
        positive, negative = (groups == q) & (sign > 0), (groups == q) & (sign < 0)
        rows.append({"method": method, "group": q + 1,
                     "pos_tokens": int(positive.sum()), "pos_rose_share": mean_over(delta > 0, positive),
                     "neg_tokens": int(negative.sum()), "neg_fell_share": mean_over(delta < 0, negative),
                     "mean_delta_logprob_pos": mean_over(delta, positive)})
    return rows


def sampled_batch(model, tokenizer, style, task, args, *, seed, max_new_tokens):
    """One seed's held-out prompts x M samples -> ((ids, attention, completion mask), advantages)"""
    device = next(model.parameters()).device
    torch.manual_seed(seed)
    examples = task.examples("test", args.num_prompts, seed=seed)
    [(rollouts, _)], rewards = sample_groups(model, tokenizer, task, examples, args.M, style=style,
                                             temperature=args.temperature, max_new_tokens=max_new_tokens,
                                             batch_prompts=len(examples))
    advantages = group_advantages(rewards, args.method, tau=args.tau).view(-1).to(device)
    batch = tuple(t.to(device) for t in (rollouts.input_ids, rollouts.attention_mask, rollouts.completion_mask))
    return batch, advantages


def measure(model, tokenizer, style, task, args, *, seed, lr, max_new_tokens, clip_high):
    """One seed -> (fig1d rows, fig3 rows, tokens with A != 0); None when every advantage is 0."""
    batch, advantages = sampled_batch(model, tokenizer, style, task, args, seed=seed, max_new_tokens=max_new_tokens)
    with torch.no_grad():  # p_old, computed exactly as the post-update log-probs below (same code, same batches)
        old_logprobs = token_logprobs(model, *batch, temperature=args.temperature, micro_batch=args.micro_batch)
    norms = logit_gradient_norms(model, *batch, temperature=args.temperature, micro_batch=args.micro_batch)
    token_mask = batch[2].bool() & (advantages != 0)[:, None]
    if not token_mask.any():
        return None
    old_probs = old_logprobs.exp()
    groups = probability_groups(old_probs.cpu(), token_mask.cpu(), args.groups).to(advantages.device)
    weighted = advantages.abs()[:, None] * norms
    total = weighted[token_mask].sum().item()
    grad_norms = [None] * NUM_GROUPS
    if args.param_grad:
        grad_norms = param_grad_norms(model, batch, advantages, groups, total_tokens=batch[2].sum().item(),
                                      temperature=args.temperature, micro_batch=args.micro_batch)
    fig1d = []
    for q in range(NUM_GROUPS):
        in_group = groups == q
        p_group = old_probs[in_group]  # may be empty with --groups fixed: its row reports nan
        fig1d.append({"seed": seed, "group": q + 1, "p_min": p_group.min().item() if len(p_group) else math.nan,
                      "p_max": p_group.max().item() if len(p_group) else math.nan,
                      "tokens": int(in_group.sum()), "mean_p_old": p_group.mean().item(),
                      "mean_norm": norms[in_group].mean().item(), "mean_adv_x_norm": weighted[in_group].mean().item(),
                      "share_of_sum": weighted[in_group].sum().item() / total,
                      "param_grad_norm": "" if grad_norms[q] is None else grad_norms[q]})
    fig3 = []
    for method, setting in UPDATES.items():
        updated = one_update(copy.deepcopy(model), batch, advantages, old_logprobs, lr=lr, temperature=args.temperature,
                             clip_high=clip_high, micro_batch=args.micro_batch, optimizer=args.optimizer, **setting)
        with torch.no_grad():
            new_logprobs = token_logprobs(updated, batch[0], batch[1], batch[2], temperature=args.temperature,
                                          micro_batch=args.micro_batch)
        fig3 += [{"seed": seed, **row} for row in rise_rows(method, old_logprobs, new_logprobs, advantages, groups)]
        del updated
    return fig1d, fig3, int(token_mask.sum())


def over_seeds(fig3):
    def cell(method, q, key):
        return {r["seed"]: r[key] for r in fig3 if r["method"] == method and r["group"] == q
                and not math.isnan(r[key])}

    def summary(values):  # -> (n, mean, sd, se) with nan where a value is undefined (the CSV's convention)
        mean, sd, se = mean_sd_se(values) if values else (math.nan, None, None)
        return len(values), mean, math.nan if sd is None else sd, math.nan if se is None else se

    rows = []
    for method in dict.fromkeys(r["method"] for r in fig3):
        for q in range(1, NUM_GROUPS + 1):
            row = {"method": method, "group": q}
            for key in ("pos_rose_share", "neg_fell_share"):
                shares, grpo = cell(method, q, key), cell("grpo", q, key)
                n, mean, sd, se = summary(list(shares.values()))
                row.update({f"{key}_seeds": n, f"{key}_mean": mean, f"{key}_sd": sd, f"{key}_se": se})
                _, mean, _, se = summary([shares[s] - grpo[s] for s in shares if s in grpo])
                row.update({f"{key}_minus_grpo_mean": mean, f"{key}_minus_grpo_se": se})
            rows.append(row)
    return rows


def write_csv(path, rows):
    with output_file(path) as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in r.items()} for r in rows)


def plot(output_dir, fig1d, summary, seeds):
    plt = pyplot("the PNGs; the CSVs have the numbers")
    if plt is None:
        return []

    def over(key, q):
        return statistics.fmean(r[key] for r in fig1d if r["group"] == q + 1)

    labels = [f"Q{q + 1}\n{over('p_min', q):.3f}-{over('p_max', q):.3f}" for q in range(NUM_GROUPS)]
    seeds_text = f"seed {seeds[0]}" if len(seeds) == 1 else f"mean of {len(seeds)} seeds"
    x = list(range(NUM_GROUPS))
    fig, ax = plt.subplots(figsize=(5, 3.8))
    ax.bar(x, [over("mean_adv_x_norm", q) for q in x], color="tab:blue")
    ax.set_yscale("log")  # the low-probability group is often orders of magnitude ahead
    ax.set_xticks(x, labels)
    ax.set_xlabel("p_old group (range)")
    ax.set_ylabel("mean |A| * ||onehot - softmax||")
    ax.set_title(f"Lopti Fig. 1(d): logit gradient norm per token ({seeds_text})", fontsize=9)
    fig.tight_layout()
    paths = [os.path.join(output_dir, "fig1d_grad_norm.png")]
    write_figure(fig, paths[0], dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 3.8))
    methods = list(dict.fromkeys(r["method"] for r in summary))
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        rows = [r for r in summary if r["method"] == method]
        errors = [r["pos_rose_share_sd"] for r in rows] if len(seeds) > 1 else None
        ax.bar([q + (i - (len(methods) - 1) / 2) * width for q in x], [r["pos_rose_share_mean"] for r in rows],
               width, yerr=errors, capsize=2, label=method)
    ax.set_xticks(x, labels)
    ax.set_ylim(0, 1)
    ax.set_xlabel("p_old group (range" + (", mean over seeds)" if len(seeds) > 1 else ")"))
    ax.set_ylabel("share of A > 0 tokens whose prob. rose")
    ax.set_title(f"Lopti Fig. 3: after one update ({seeds_text}" + (", bars: std)" if len(seeds) > 1 else ")"),
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(os.path.join(output_dir, "fig3_prob_rise.png"))
    write_figure(fig, paths[1], dpi=120)
    plt.close(fig)
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_checkpoint_arguments(parser)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("-M", "--num-generations", dest="M", type=int, default=8)
    parser.add_argument("--method", default="grpo", choices=METHODS, help="group advantages (Lopti paper: grpo)")
    parser.add_argument("--tau", type=float, default=0.1, help="for --method softmax")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: train.py's (tiny or not)")
    parser.add_argument("--lr", type=float, default=None, help="default: train.py's (3e-4 tiny, 1e-6 otherwise)")
    parser.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd"))
    parser.add_argument("--clip-high", type=float, default=None, help="default: train.py's")
    parser.add_argument("--groups", default="quantile", choices=("quantile", "fixed"))
    parser.add_argument("--param-grad", action="store_true", help="Fig. 1(d): parameter-gradient norm per group")
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: --seed), "
                        "Fig. 3 over them; a {seed} in --checkpoint picks each seed's checkpoint")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--output-dir", default="runs/lopti_stats")
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [args.seed]
    except ValueError:
        parser.error(f"--seeds: expected comma-separated integers, got {args.seeds!r}")
    checkpoint_pattern, loaded = args.checkpoint, None
    fig1d, fig3 = [], []
    for seed in seeds:
        args.checkpoint = checkpoint_pattern.replace("{seed}", str(seed))
        if loaded is None or loaded[0] != args.checkpoint:
            loaded = (args.checkpoint, *load_for_experiment(args, parser))
        _, model, tokenizer, style, task, defaults = loaded
        max_new_tokens = args.max_new_tokens or defaults.max_new_tokens
        lr = args.lr if args.lr is not None else defaults.lr
        clip_high = args.clip_high if args.clip_high is not None else Config.clip_high
        measured = measure(model, tokenizer, style, task, args, seed=seed, lr=lr, max_new_tokens=max_new_tokens,
                           clip_high=clip_high)
        if measured is None:
            parser.error(f"seed {seed}: every group has equal rewards (all advantages 0): nothing to measure; use "
                         "more prompts")
        seed_fig1d, seed_fig3, tokens = measured
        fig1d += seed_fig1d
        fig3 += seed_fig3
        print(f"checkpoint {args.checkpoint} ({style}), task {task.name}, seed {seed}, {args.num_prompts} prompts x "
              f"M={args.M}, {tokens} tokens with A != 0, groups: {args.groups}, update lr {lr:g}")
        print("Fig. 1(d) | group | p_old range | tokens | mean ||e-pi|| | mean |A|*||e-pi|| | share | param grad |")
        for r in seed_fig1d:
            grad = f"{r['param_grad_norm']:.4g}" if r["param_grad_norm"] != "" else "-"
            print(f"  Q{r['group']} | {r['p_min']:.3f}-{r['p_max']:.3f} | {r['tokens']} | {r['mean_norm']:.3f} | "
                  f"{r['mean_adv_x_norm']:.3f} | {r['share_of_sum']:.3f} | {grad} |")
        print_fig3({(r["method"], r["group"]): (r["pos_rose_share"], r["neg_fell_share"]) for r in seed_fig3})
    summary = over_seeds(fig3)
    if len(seeds) > 1:
        print(f"Fig. 3 over seeds {','.join(map(str, seeds))}: mean +- sample std")
        print_fig3({(r["method"], r["group"]): (r["pos_rose_share_mean"], r["neg_fell_share_mean"],
                                                r["pos_rose_share_sd"]) for r in summary})
        print("A>0 tokens whose probability rose, minus GRPO's share on the same seed: mean +- SE over seeds")
        for method in list(UPDATES)[1:]:
            print(f"  {method:<8} | " + " | ".join(
                f"{r['pos_rose_share_minus_grpo_mean']:+.3f} +- {r['pos_rose_share_minus_grpo_se']:.3f}"
                for r in summary if r["method"] == method) + " |")
    os.makedirs(args.output_dir, exist_ok=True)
    write_csv(os.path.join(args.output_dir, "fig1d_grad_norm.csv"), fig1d)
    write_csv(os.path.join(args.output_dir, "fig3_prob_rise.csv"), fig3)
    write_csv(os.path.join(args.output_dir, "fig3_prob_rise_summary.csv"), summary)
    print(f"wrote {args.output_dir}/fig1d_grad_norm.csv, fig3_prob_rise.csv, fig3_prob_rise_summary.csv")
    for path in plot(args.output_dir, fig1d, summary, seeds):
        print(f"wrote {path}")
    return fig1d, fig3


def print_fig3(cells):
    print("Fig. 3: share of A>0 tokens whose probability rose (A<0 tokens whose probability fell), by group")
    print("  method   | " + " | ".join(f"Q{q + 1}" for q in range(NUM_GROUPS)) + " |")
    for method in UPDATES:
        texts = []
        for q in range(1, NUM_GROUPS + 1):
            rose, fell, *sd = cells[(method, q)]
            texts.append(f"{rose:.2f}" + (f" +- {sd[0]:.2f}" if sd else "") + f" ({fell:.2f})")
        print(f"  {method:<8} | " + " | ".join(texts) + " |")


if __name__ == "__main__":
    main()
