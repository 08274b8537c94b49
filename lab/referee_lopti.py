"""The Lopti referee's questions (issue 30, items 5-7): per probability quartile, the token weights, the SUMMED
parameter gradients and their directions, and logits- vs parameter-gradient norms, on one batch of rollouts.

    python -m lab.referee_lopti --checkpoint runs/default/latest            # after RL, pi_ref its start
    python -m lab.referee_lopti --checkpoint runs/default/latest --initial  # the same run before RL
    python -m lab.referee_lopti --checkpoint runs/smollm2/seed0/latest --task text_match \\
        --data runs/smollm2/data --num-prompts 8 -M 4 --max-new-tokens 32

Per seed: the first --num-prompts held-out prompts x M rollouts at --temperature (experiments.table3_allocation's
sample_groups), GRPO advantages (--method), p_old the sampled tokens' probabilities under the checkpoint. The
tokens are those train.py trains without KL (ppo.rows_with_gradient): every completion token of the rows with
A != 0, for both beta (with KL train.py also trains the A = 0 rows on the KL alone; they are left out, so that both
beta measure the same tokens); they are cut into four equal-count quartiles of p_old
(lopti_token_stats.probability_groups; Q1 lowest). Each quantity with beta = 0 and with --beta (the papers' 1e-3):
  5. the token weight w_t = (pi / pi_old) A I_trust + beta (pi_ref / pi - 1), the coefficient of grad log pi_t in
     -grad of train.py's loss (ppo.policy_loss: clipped surrogate + beta k3, whose gradient is (1 - pi_ref/pi)
     grad log pi). On-policy at the measurement, pi = pi_old, so the ratio is 1 and every token is in the trust
     region. pi_ref: --ref-checkpoint (the run's initial policy); without it pi_ref = pi, the KL part is 0 and
     only beta = 0 is measured (before RL the two are the same). Mean and median |w| per quartile.
  6. G_q = grad_theta (1/N) sum_{t in q} w_t log pi_t with w detached (N: every completion token of the batch,
     train.py's token-mean): the quartile's SUMMED parameter gradient; G = sum_q G_q is train.py's (unclipped)
     gradient on those tokens. Per quartile ||G_q||, its share ||G_q|| / ||G||, cos(G_q, G) and the 4 x 4
     cosines between quartiles.
  7. per token, on --token-samples tokens drawn from each quartile: the logits-gradient norm |w| ||e_o - softmax||
     (Prop. 4.2's quantity, lopti_token_stats.logit_gradient_norms) and the parameter-gradient norm
     |w| ||grad_theta log pi_t|| (one backward per token); their means per quartile.
  5, off-policy (the referee's clipped case; --no-off-policy skips it; referee_lopti_offpolicy.csv): its
     protocol is lab/referee_lopti_offpolicy.py's docstring.
The referee's test: "if the summed high-probability gradient is comparable to or larger than the low-probability
one, the dominance claim fails". Here the high/low ratio ||G_Q4|| / ||G_Q1|| per seed, mean and 95% t-interval
over seeds; the verdict reads "dominance holds" when the interval lies below 0.5, "fails" when it lies above 0.5,
else "undecided" (0.5, "comparable", is this script's threshold, not the referee's).
Writes <output-dir>/referee_lopti.csv (one row per seed, beta and quartile), referee_lopti_cosines.csv and, with
matplotlib, referee_lopti.png. Numbers: lab/referees.md.
"""
import argparse
import json
import math
import os
import statistics

import torch

from experiments import pyplot, save_figure, write_csv
from experiments.runs import seed_list
from experiments.lopti_token_stats import NUM_GROUPS, logit_gradient_norms, probability_groups, sampled_batch
from lab.referee_lopti_offpolicy import measure_off_policy, saved_moments, step_settings, summarize_off_policy
from lab.seed_stats import interval_text, mean_se_interval
from experiments.table3_allocation import add_checkpoint_arguments, load_for_experiment
from harness.model import load_policy
from ppo import rows_with_gradient
from rollout import token_logprobs
from softmax_grpo import METHODS

THRESHOLD = 0.5  # ||G_Q4|| / ||G_Q1|| above it: "comparable" (the verdict's line, see the docstring)


# ---------------------------------------------------------------------------------------------------------------
# The three measurements on one batch
# ---------------------------------------------------------------------------------------------------------------
def token_weights(advantages, logprobs, ref_logprobs, completion_mask, beta):
    """w [B, T] = A (ratio 1, inside the trust region: on-policy) + beta (pi_ref / pi - 1), 0 off the mask.
    advantages [B]; logprobs, ref_logprobs [B, T] (ref None: pi_ref = pi)."""
    kl_part = 0.0 if ref_logprobs is None or beta == 0 else beta * torch.expm1(ref_logprobs - logprobs)
    return (advantages[:, None] + kl_part) * completion_mask


def quartile_gradients(model, batch, weights, groups, *, temperature, micro_batch):
    """-> [4, P] float32: G_q = grad (1/N) sum_{t in q} w_t log pi_t for q = 0..3, flattened over the parameters
    (N = completion tokens of the batch). One forward per micro-batch, one backward per quartile."""
    input_ids, attention_mask, completion_mask = batch
    params = [p for p in model.parameters() if p.requires_grad]
    total = completion_mask.sum()
    sums = torch.zeros(NUM_GROUPS, sum(p.numel() for p in params))
    for start in range(0, input_ids.shape[0], micro_batch):
        rows = slice(start, start + micro_batch)
        present = [q for q in range(NUM_GROUPS) if (groups[rows] == q).any()]
        if not present:
            continue
        logprobs = token_logprobs(model, input_ids[rows], attention_mask[rows], completion_mask[rows],
                                  temperature=temperature)
        for i, q in enumerate(present):
            objective = (weights[rows] * logprobs * (groups[rows] == q)).sum() / total
            grads = torch.autograd.grad(objective, params, allow_unused=True, retain_graph=i < len(present) - 1)
            sums[q] += torch.cat([(g if g is not None else torch.zeros_like(p)).float().flatten().cpu()
                                  for g, p in zip(grads, params)])
    return sums


def per_token_norms(model, batch, weights, groups, logit_norms, *, samples, generator, temperature):
    """Per quartile, on up to `samples` of its tokens drawn at random: mean |w| ||e_o - softmax|| (logits gradient)
    and mean |w| ||grad_theta log pi_t|| (parameter gradient, one backward per token) -> two lists of 4 floats."""
    input_ids, attention_mask, completion_mask = batch
    params = [p for p in model.parameters() if p.requires_grad]
    logit_means, param_means = [], []
    for q in range(NUM_GROUPS):
        positions = (groups == q).nonzero()
        pick = positions[torch.randperm(len(positions), generator=generator)[:samples]]
        logit, param = [], []
        for row in pick[:, 0].unique().tolist():
            logprobs = token_logprobs(model, input_ids[row:row + 1], attention_mask[row:row + 1],
                                      completion_mask[row:row + 1], temperature=temperature)[0]
            columns = pick[pick[:, 0] == row, 1].tolist()
            for i, t in enumerate(columns):
                grads = torch.autograd.grad(logprobs[t], params, allow_unused=True, retain_graph=i < len(columns) - 1)
                norm = math.sqrt(sum((g.float() ** 2).sum().item() for g in grads if g is not None))
                param.append(abs(weights[row, t].item()) * norm)
                logit.append(abs(weights[row, t].item()) * logit_norms[row, t].item())
        logit_means.append(statistics.fmean(logit) if logit else math.nan)
        param_means.append(statistics.fmean(param) if param else math.nan)
    return logit_means, param_means


def initial_policy(checkpoint):
    """The initial (reference) policy a train.py checkpoint names in its run.json, or None (not a train.py
    checkpoint: a warm start, a pretrained model)."""
    try:
        with open(os.path.join(checkpoint, "run.json")) as f:
            return json.load(f).get("initial_policy")
    except (OSError, ValueError):
        return None


def cosine(a, b):
    return (a @ b / (a.norm() * b.norm()).clamp_min(1e-30)).item()


def measure(model, tokenizer, style, task, ref_model, args, *, seed, max_new_tokens, off_policy=None):
    """One seed's batch -> (rows per (beta, quartile), cosine rows, tokens, off-policy rows per (beta, quartile));
    None when every group ties. off_policy: (step settings, saved AdamW moments or None), or None to skip it."""
    batch, advantages = sampled_batch(model, tokenizer, style, task, args, seed=seed, max_new_tokens=max_new_tokens)
    if not advantages.any():
        return None
    mask = batch[2].float()
    with torch.no_grad():
        logprobs = token_logprobs(model, *batch, temperature=args.temperature, micro_batch=args.micro_batch)
        ref_logprobs = None if ref_model is None else token_logprobs(
            ref_model, *batch, temperature=args.temperature, micro_batch=args.micro_batch)
    logit_norms = logit_gradient_norms(model, *batch, temperature=args.temperature, micro_batch=args.micro_batch)
    generator = torch.Generator().manual_seed(seed)
    rows, cosines = [], []
    betas = (0.0, args.beta) if ref_model is not None and args.beta > 0 else (0.0,)  # pi_ref = pi: no KL
    for beta in betas:
        # the same tokens for both beta: the rows with A != 0 (with KL, train.py also trains the A = 0 rows, whose
        # w is beta (pi_ref / pi - 1) alone, ~1e-3 of |A|: left out, so that both beta measure the same tokens)
        trained = rows_with_gradient(advantages[:, None] * mask, mask, kl=False)  # [B]
        token_mask = mask.bool() & trained[:, None]
        groups = probability_groups(logprobs.exp().cpu(), token_mask.cpu()).to(advantages.device)
        weights = token_weights(advantages, logprobs, ref_logprobs, mask, beta)
        sums = quartile_gradients(model, batch, weights, groups, temperature=args.temperature,
                                  micro_batch=args.micro_batch)
        full = sums.sum(0)
        logit_means, param_means = per_token_norms(model, batch, weights, groups, logit_norms,
                                                   samples=args.token_samples, generator=generator,
                                                   temperature=args.temperature)
        for q in range(NUM_GROUPS):
            in_q = groups == q
            w = weights[in_q].abs()
            p = logprobs.exp()[in_q]
            rows.append({"seed": seed, "beta": beta, "quartile": q + 1, "tokens": int(in_q.sum()),
                         "p_min": p.min().item(), "p_max": p.max().item(), "mean_abs_w": w.mean().item(),
                         "median_abs_w": w.median().item(), "summed_grad_norm": sums[q].norm().item(),
                         "share_of_full_norm": (sums[q].norm() / full.norm()).item(),
                         "cos_with_full": cosine(sums[q], full), "token_logit_grad_norm": logit_means[q],
                         "token_param_grad_norm": param_means[q]})
            cosines += [{"seed": seed, "beta": beta, "quartile": q + 1, "with": r + 1, "cos": cosine(sums[q], sums[r])}
                        for r in range(NUM_GROUPS) if r != q]
    off_rows = []
    if off_policy is not None:
        settings, moments = off_policy
        off_rows = measure_off_policy(model, batch, advantages, logprobs, ref_logprobs, groups, token_mask, settings,
                                      seed=seed, betas=betas, ref_model=ref_model, moments=moments,
                                      temperature=args.temperature, micro_batch=args.micro_batch)
    return rows, cosines, int(mask.sum()), off_rows


# ---------------------------------------------------------------------------------------------------------------
# Over seeds: the table, the verdict, the picture
# ---------------------------------------------------------------------------------------------------------------
def verdict(ratios):
    """The referee's test on ||G_Q4|| / ||G_Q1|| over seeds -> one sentence."""
    mean, _, interval = mean_se_interval(ratios)
    if interval is None:
        return f"one seed only (ratio {mean:.3g}): no verdict"
    if interval[1] < THRESHOLD:
        return f"the low-probability quartile's summed gradient dominates (Q4/Q1 {mean:.3g}, all of the interval " \
               f"below {THRESHOLD}): the dominance claim holds"
    if interval[0] > THRESHOLD:
        return f"the high-probability quartile's summed gradient is comparable or larger (Q4/Q1 {mean:.3g}, all " \
               f"of the interval above {THRESHOLD}): the dominance claim fails"
    return f"undecided: the interval of Q4/Q1 ({interval[0]:.3g}, {interval[1]:.3g}) straddles {THRESHOLD}"


def summarize(rows, cosines):
    """Print per beta and quartile the mean over seeds (± SE [95% interval]) of each column, the cosines, and the
    verdict -> {beta: verdict sentence}."""
    keys = ("mean_abs_w", "median_abs_w", "summed_grad_norm", "share_of_full_norm", "cos_with_full",
            "token_logit_grad_norm", "token_param_grad_norm")
    verdicts = {}
    for beta in dict.fromkeys(r["beta"] for r in rows):
        mine = [r for r in rows if r["beta"] == beta]
        seeds = sorted({r["seed"] for r in mine})
        print(f"\nbeta = {beta:g}, seeds {seeds}: mean ± SE [95% t-interval] over seeds")
        print("| quartile | p_old range | tokens | " + " | ".join(keys) + " |")
        print("|---|---|---|" + "---|" * len(keys))
        for q in range(1, NUM_GROUPS + 1):
            cells = [r for r in mine if r["quartile"] == q]
            print(f"| Q{q} | {min(r['p_min'] for r in cells):.3g}-{max(r['p_max'] for r in cells):.3g} | "
                  f"{statistics.fmean(r['tokens'] for r in cells):.0f} | "
                  + " | ".join(interval_text([r[key] for r in cells if not math.isnan(r[key])]) for key in keys)
                  + " |")
        pairs = [(q, r) for q in range(1, NUM_GROUPS + 1) for r in range(q + 1, NUM_GROUPS + 1)]
        cos = {}
        for c in cosines:
            if c["beta"] == beta:
                cos.setdefault((c["quartile"], c["with"]), []).append(c["cos"])
        print("cosines between the quartiles' summed gradients: "
              + ", ".join(f"Q{q}-Q{r} {interval_text(cos[(q, r)])}" for q, r in pairs))
        norm = {(r["seed"], r["quartile"]): r["summed_grad_norm"] for r in mine}
        ratios = [norm[(s, 4)] / norm[(s, 1)] for s in seeds]
        verdicts[beta] = verdict(ratios)
        print(f"||G_Q4|| / ||G_Q1|| per seed {' '.join(f'{x:.3g}' for x in ratios)}: {verdicts[beta]}")
    return verdicts


def onpolicy_metrics(rows):
    """The on-policy rows (referee_lopti.csv) of several batches, beta 0 -> {metric: value}: per quartile q
    "onpolicy_Q{q}_mean_abs_w", its summed gradient's share of the full norm (_share_of_norm) and cosine with the full
    gradient (_cos_with_full) and item 7's per-token logits- and parameter-gradient norms (_token_logit_grad_norm,
    _token_param_grad_norm), each the mean over the batches with its SE over them (_se), the quartile's p_old range
    over the batches (_p_old_min, _p_old_max), and "onpolicy_G_Q4_over_G_Q1"
    (||G_Q4|| / ||G_Q1|| per batch, its mean and _se). A single batch has no SE: left out."""
    metrics = {}
    mine = [r for r in rows if r["beta"] == 0]

    def put(name, values):
        mean, se, _ = mean_se_interval(values)
        metrics[name] = round(mean, 6)
        if se is not None:
            metrics[name + "_se"] = round(se, 6)

    for q in sorted({int(r["quartile"]) for r in mine}):
        cells = [r for r in mine if int(r["quartile"]) == q]
        put(f"onpolicy_Q{q}_mean_abs_w", [r["mean_abs_w"] for r in cells])
        put(f"onpolicy_Q{q}_share_of_norm", [r["share_of_full_norm"] for r in cells])
        put(f"onpolicy_Q{q}_cos_with_full", [r["cos_with_full"] for r in cells])
        for key in ("token_logit_grad_norm", "token_param_grad_norm"):  # item 7's per-token norms
            put(f"onpolicy_Q{q}_{key}", [r[key] for r in cells])
        metrics[f"onpolicy_Q{q}_p_old_min"] = round(min(r["p_min"] for r in cells), 6)
        metrics[f"onpolicy_Q{q}_p_old_max"] = round(max(r["p_max"] for r in cells), 6)
    norm = {(r["seed"], int(r["quartile"])): r["summed_grad_norm"] for r in mine}
    put("onpolicy_G_Q4_over_G_Q1", [norm[(s, 4)] / norm[(s, 1)] for s in sorted({r["seed"] for r in mine})])
    return metrics


def cosine_metrics(rows):
    """The cosines between the quartiles' summed gradients (referee_lopti_cosines.csv rows of several batches, beta 0)
    -> {"onpolicy_cos_Q{a}_Q{b}": mean over the batches, and its _se}."""
    metrics = {}
    mine = [r for r in rows if r["beta"] == 0]
    pairs = {(int(r["quartile"]), int(r["with"])) for r in mine}
    for a, b in sorted((a, b) for a, b in pairs if a < b):
        mean, se, _ = mean_se_interval([r["cos"] for r in mine if (int(r["quartile"]), int(r["with"])) == (a, b)])
        metrics[f"onpolicy_cos_Q{a}_Q{b}"] = round(mean, 6)
        if se is not None:
            metrics[f"onpolicy_cos_Q{a}_Q{b}_se"] = round(se, 6)
    return metrics


def plot(path, rows, title):
    plt = pyplot("the PNG; the CSVs have the numbers")
    if plt is None:
        return False
    panels = [("mean |w|", "mean_abs_w"), ("||summed gradient of Q|| / ||full||", "share_of_full_norm"),
              ("per-token logits-gradient norm", "token_logit_grad_norm"),
              ("per-token parameter-gradient norm", "token_param_grad_norm")]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.2))
    quartiles = list(range(1, NUM_GROUPS + 1))
    for ax, (label, key) in zip(axes, panels):
        for i, beta in enumerate(dict.fromkeys(r["beta"] for r in rows)):
            stats = [mean_se_interval([r[key] for r in rows if r["beta"] == beta and r["quartile"] == q
                                       and not math.isnan(r[key])]) for q in quartiles]
            ax.errorbar([q + 0.08 * i for q in quartiles], [m for m, _, _ in stats],
                        yerr=[se or 0 for _, se, _ in stats], marker="o", capsize=3, label=f"beta = {beta:g}")
        if key != "mean_abs_w":
            ax.set_yscale("log")
        ax.set_xticks(quartiles, [f"Q{q}" for q in quartiles])
        ax.set_xlabel("p_old quartile (Q1 lowest)")
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return save_figure(plt, fig, path, title)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    add_checkpoint_arguments(parser)
    parser.add_argument("--initial", action="store_true", help="measure the checkpoint's initial policy (its "
                        "run.json's initial_policy: the warm start, or the pretrained model) instead: before RL")
    parser.add_argument("--ref-checkpoint", default=None, help="pi_ref; default: the checkpoint's initial policy "
                        "(run.json), else the checkpoint itself (the KL part of w is then 0)")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("-M", "--num-generations", dest="M", type=int, default=8)
    parser.add_argument("--method", default="grpo", choices=METHODS, help="group advantages (Lopti paper: grpo)")
    parser.add_argument("--tau", type=float, default=0.1, help="for --method softmax")
    parser.add_argument("--beta", type=float, default=1e-3, help="the KL coefficient of the recipe (papers: 1e-3)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: train.py's (tiny or not)")
    parser.add_argument("--token-samples", type=int, default=16, help="tokens per quartile for item 7's norms")
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--seeds", default="0,1,2", help="one batch each (its prompts and samples); a {seed} in "
                        "--checkpoint / --ref-checkpoint picks that seed's checkpoint")
    parser.add_argument("--no-off-policy", dest="off_policy", action="store_false", help="skip the off-policy "
                        "state (item 5's clipped case: one train.py step on the first of 2 mini-batches, then rescore)")
    parser.add_argument("--clip-low", type=float, default=None, help="the off-policy state's clip; default: the "
                        "checkpoint run's (run.json), else train.py's")
    parser.add_argument("--clip-high", type=float, default=None, help="likewise")
    parser.add_argument("--dual-clip", type=float, default=None, help="likewise (the Lopti recipes: 10; 0: none)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--output-dir", default="runs/referee_lopti")
    args = parser.parse_args(argv)
    seeds = seed_list(parser, args.seeds)
    if not seeds or args.beta < 0 or args.token_samples < 1:
        parser.error("need at least one seed, --beta >= 0 and --token-samples >= 1")
    pattern, ref_pattern = args.checkpoint, args.ref_checkpoint
    rows, cosines, off_rows, settings = [], [], [], None
    loaded = {}  # (policy, pi_ref) -> what load_for_experiment and load_policy gave: loaded once, not per seed
    for seed in seeds:
        checkpoint = pattern.replace("{seed}", str(seed))
        initial = initial_policy(checkpoint)
        if args.initial and initial is None:
            parser.error(f"--initial: {checkpoint} has no run.json naming its initial policy")
        args.checkpoint = initial if args.initial else checkpoint
        ref = None if args.initial else ref_pattern.replace("{seed}", str(seed)) if ref_pattern else initial
        if (args.checkpoint, ref) not in loaded:
            loaded.clear()  # one policy and one reference in memory at a time (a 135M model: ~0.5 GB each)
            ref_model = None
            if ref:
                try:
                    ref_model, _ = load_policy(ref, device=args.device)
                except ValueError as error:
                    parser.error(f"pi_ref: {error}")
            loaded[(args.checkpoint, ref)] = (*load_for_experiment(args, parser), ref_model)
        model, tokenizer, style, task, defaults, ref_model = loaded[(args.checkpoint, ref)]
        off_policy = None
        if args.off_policy:  # the run's step settings; its saved AdamW moments only for the checkpoint itself
            settings = step_settings(checkpoint, args, defaults)
            off_policy = (settings, None if args.initial else saved_moments(checkpoint))
        measured = measure(model, tokenizer, style, task, ref_model, args, seed=seed,
                           max_new_tokens=args.max_new_tokens or defaults.max_new_tokens, off_policy=off_policy)
        if measured is None:
            parser.error(f"seed {seed}: every group has equal rewards (all advantages 0): nothing to measure; use "
                         "more prompts")
        rows += measured[0]
        cosines += measured[1]
        off_rows += measured[3]
        os.makedirs(args.output_dir, exist_ok=True)  # the seeds so far: a long measurement stopped keeps them
        write_csv(os.path.join(args.output_dir, "referee_lopti.csv"), rows)
        write_csv(os.path.join(args.output_dir, "referee_lopti_cosines.csv"), cosines)
        if off_rows:
            write_csv(os.path.join(args.output_dir, "referee_lopti_offpolicy.csv"), off_rows)
        print(f"seed {seed}: {args.checkpoint}" + (f" (pi_ref {ref})" if ref else "")
              + f", {args.num_prompts} prompts x M={args.M}, {measured[2]} completion tokens", flush=True)
    verdicts = summarize(rows, cosines)
    if off_rows:
        summarize_off_policy(off_rows, settings)
    drew = plot(os.path.join(args.output_dir, "referee_lopti.png"), rows,
                f"{pattern}: per p_old quartile, seeds {args.seeds} (mean ± SE)")
    print(f"wrote {args.output_dir}/referee_lopti.csv, referee_lopti_cosines.csv"
          + (", referee_lopti_offpolicy.csv" if off_rows else "") + (" and referee_lopti.png" if drew else ""))
    return rows, cosines, verdicts, off_rows


if __name__ == "__main__":
    main()
