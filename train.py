"""RL fine-tuning of a causal LM with SoftmaxGRPO / GRPO-family advantages, Advantage Reweighting and Lopti.

    python train.py                      # offline default: tiny Llama, warm start, SoftmaxGRPO on Countdown (CPU)
    python train.py --model Qwen/Qwen2.5-0.5B-Instruct --task countdown --lr 1e-6 ...   # see README

One step: sample prompts -> M rollouts each -> task rewards -> group advantages -> optional AR reweighting ->
one clipped-surrogate update (or Lopti's two passes) -> metrics. Formulas: DESIGN.md; code: softmax_grpo.py,
ppo.py, lopti.py, rollout.py, model.py.
"""
import argparse
import contextlib
import copy
import json
import os
import random
import signal
import sys
import time

import numpy as np
import torch
import transformers
from tqdm import tqdm

import tasks
from lopti import PASS_ORDERS, isolation_masks, lopti_passes, reweight_advantages
from model import load_policy, warm_start, warm_start_dir
from ppo import LOSS_AGGS, policy_loss
from rollout import evaluate, generate_rollouts, render_prompts, token_logprobs
from softmax_grpo import METHODS, group_advantages

TIMING_KEYS = ("rollout_s", "update_s", "tokens_per_s")  # the only metrics that differ between identical runs


# --------------------------------------------------------------------------------------------------------------
# Arguments (defaults: the papers' settings unless marked "tiny default"; DESIGN.md section 1)
# --------------------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="tiny", help="HF hub id, save_pretrained folder, .gguf file, or 'tiny'")
    p.add_argument("--task", default="countdown", choices=sorted(tasks.TASKS))
    p.add_argument("--data", default=None, help="data file for gsm8k / text_match")
    p.add_argument("--task-option", action="append", default=[], metavar="KEY=VALUE",
                   help="task factory option, e.g. num_count=3 (--model tiny on countdown: num_count=2 unless given)")
    p.add_argument("--method", default="softmax", choices=METHODS, help="group advantage estimator")
    p.add_argument("--tau", type=float, default=0.1, help="SoftmaxGRPO temperature (paper: 0.1 Countdown/GSM8K)")
    p.add_argument("--num-generations", "-M", type=int, default=8, help="completions per prompt (paper: 8)")
    p.add_argument("--prompts-per-step", type=int, default=64, help="prompts per step (paper: 64)")
    p.add_argument("--alpha", type=float, default=0.0, help="AR: A*(alpha*p_old+1-alpha); 0 = off (paper 0.1-0.3)")
    p.add_argument("--lopti-eta", type=float, default=0.0, help="Lopti split p_old < eta; 0 = off (paper: 0.5)")
    p.add_argument("--lopti-order", default="low-first", choices=PASS_ORDERS)
    p.add_argument("--clip-low", type=float, default=0.2)
    p.add_argument("--clip-high", type=float, default=0.28, help="SoftmaxGRPO 0.28; Lopti paper 0.24")
    p.add_argument("--dual-clip", type=float, default=None, help="cap for A < 0 (Lopti paper: 10)")
    p.add_argument("--kl-coef", type=float, default=0.0, help="k3 KL to the initial policy; 0 = no reference model "
                   "(papers: 1e-3)")
    p.add_argument("--loss-agg", default="token-mean", choices=LOSS_AGGS)
    p.add_argument("--lr", type=float, default=None, help="AdamW lr; default 1e-6 (papers), 3e-4 for --model tiny")
    p.add_argument("--warmup-steps", type=int, default=0, help="linear lr warm-up, then constant")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--ppo-epochs", type=int, default=1, help="updates per batch; 1 = on-policy (no old-logprob pass)")
    p.add_argument("--micro-batch", type=int, default=64, help="rows per forward/backward (memory knob only)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 1024, 12 for --model tiny")
    p.add_argument("--temperature", type=float, default=1.0, help="rollout temperature (SoftmaxGRPO 1.0, Lopti 0.7)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--mask-truncated", action="store_true", help="drop completions without EOS from the loss")
    p.add_argument("--steps", type=int, default=100, help="RL steps (tiny default: ~3 CPU minutes)")
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--eval-size", type=int, default=200, help="held-out prompts for greedy pass@1")
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None, help="CPU threads; default 1 for --model tiny (small "
                   "matrices gain little from more, and OpenMP threads stall on a busy CPU), else torch's default")
    p.add_argument("--dtype", default="auto", choices=("auto", "bf16", "fp32"), help="compute dtype (autocast; "
                   "weights and optimizer stay fp32); auto = bf16 on CUDA, fp32 on CPU")
    p.add_argument("--output-dir", default="runs/default")
    p.add_argument("--resume", default=None, metavar="DIR", help="checkpoint folder (e.g. runs/default/latest)")
    tiny = p.add_argument_group("tiny model and its supervised warm start")
    tiny.add_argument("--tiny-hidden", type=int, default=192)
    tiny.add_argument("--tiny-layers", type=int, default=4)
    tiny.add_argument("--warm-start-steps", type=int, default=1500, help="max SFT steps (0 = none)")
    tiny.add_argument("--warm-start-target", type=float, default=0.1, help="stop SFT at this held-out pass@1")

    def fail(message):  # one line on stderr and exit code 2; no usage dump, no traceback
        print(f"train.py: error: {message}", file=sys.stderr)
        sys.exit(2)
    p.error = fail
    args = p.parse_args(argv)
    tiny_model = args.model == "tiny"
    args.lr = args.lr if args.lr is not None else 3e-4 if tiny_model else 1e-6  # tiny: from scratch-ish, 2M params
    args.max_new_tokens = args.max_new_tokens or (12 if tiny_model else 1024)
    args.style = "compact" if tiny_model else "chat"
    args.dtype = args.dtype if args.dtype != "auto" else "bf16" if args.device.startswith("cuda") else "fp32"
    for ok, message in [(args.tau > 0, "--tau must be > 0"),
                        (args.num_generations >= 2, "--num-generations must be >= 2 (a group needs a baseline)"),
                        (args.prompts_per_step >= 1, "--prompts-per-step must be >= 1"),
                        (args.steps >= 0, "--steps must be >= 0"),
                        (0 <= args.alpha <= 1, "--alpha must lie in [0, 1]"),
                        (args.ppo_epochs >= 1, "--ppo-epochs must be >= 1"),
                        (args.micro_batch >= 1, "--micro-batch must be >= 1"),
                        (args.temperature > 0, "--temperature must be > 0"),
                        (args.eval_every >= 1 and args.save_every >= 1, "--eval-every and --save-every must be >= 1"),
                        (args.tiny_hidden > 0 and args.tiny_hidden % 4 == 0, "--tiny-hidden must be a multiple of 4")]:
        if not ok:
            p.error(message)
    try:
        options = dict(_parse_option(text) for text in args.task_option)
    except ValueError as error:
        p.error(str(error))
    if tiny_model and args.task == "countdown":
        options.setdefault("num_count", 2)  # tiny default: 2 numbers (paper: 3-4; see README for 3 with tiny)
    args.task_options = options
    return args


def _parse_option(text):
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--task-option must look like KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


# --------------------------------------------------------------------------------------------------------------
# Checkpoints: a save_pretrained folder + trainer_state.pt (optimizer, RNG states, step)
# --------------------------------------------------------------------------------------------------------------
def save_checkpoint(output_dir, step, model, tokenizer, optimizer, state):
    path = os.path.join(output_dir, f"checkpoint-{step}")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    torch.save({**state, "step": step, "optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "numpy_rng": np.random.get_state(), "python_rng": random.getstate()},
               os.path.join(path, "trainer_state.pt"))
    latest = os.path.join(output_dir, "latest")
    if os.path.islink(latest) or os.path.exists(latest):
        os.remove(latest)
    os.symlink(os.path.basename(path), latest)  # latest -> checkpoint-<step>
    return path


def restore_rng(state):
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    np.random.set_state(state["numpy_rng"])
    random.setstate(state["python_rng"])


def write_metrics(path, row):
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


# --------------------------------------------------------------------------------------------------------------
# One RL step: rollouts -> rewards -> group advantages, then the update (AR; one pass or Lopti's two) -> stats
# --------------------------------------------------------------------------------------------------------------
def precision(args):
    """The --dtype compute context: bf16 autocast over fp32 weights, or nothing (fp32)."""
    bf16 = args.dtype == "bf16"
    return torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def no_clock(name):  # clock(name) -> a context timing one phase; benchmarks/step_time.py passes a real one
    return contextlib.nullcontext()


def collect_rollouts(model, tokenizer, task, examples, args, *, clock=no_clock):
    """M sampled completions per example, their task rewards and group advantages (DESIGN.md sections 2, 5).

    -> (rollouts: rollout.Rollouts of B = len(examples) * M rows, rewards [B] float, advantages [B] float)."""
    with clock("rollout"), precision(args):
        rollouts = generate_rollouts(model, tokenizer, render_prompts(tokenizer, task, examples, args.style),
                                     args.num_generations, max_new_tokens=args.max_new_tokens,
                                     temperature=args.temperature, top_p=args.top_p, mask_truncated=args.mask_truncated)
    with clock("reward+advantage"):
        rewards = torch.tensor([task.reward(text, examples[i], style=args.style)
                                for text, i in zip(rollouts.completions, rollouts.prompt_index.tolist())])
        group_rewards = rewards.view(len(examples), args.num_generations)  # a data-file task may give fewer than G
        advantages = group_advantages(group_rewards, args.method, tau=args.tau).view(-1)  # [B]
    return rollouts, rewards, advantages


def update_policy(model, optimizer, rollouts, advantages, args, *, ref_model=None, old_logprobs=None,
                  clock=no_clock):
    """ppo_epochs x (one pass, or Lopti's low then high pass) on one batch, one optimizer step per pass.

    rollouts: input_ids / attention_mask [B, P+T], completion_mask [B, T]; advantages [B]. old_logprobs [B, T]:
    pi_old of the sampled tokens; None = computed here (on-policy: the first training forward's, detached).
    -> stats (python floats): loss, policy_loss's stats, entropy, lopti_low_share, grad_norm."""
    device = next(model.parameters()).device
    input_ids, attention_mask = rollouts.input_ids.to(device), rollouts.attention_mask.to(device)
    completion_mask, advantages = rollouts.completion_mask.to(device), advantages.to(device)

    # which rows to forward, and each row's share of the global loss denominator
    # With kl_coef = 0 a row whose advantage is 0 has exactly zero gradient, so it is skipped (still counted).
    active = (advantages != 0) | (ref_model is not None)
    rows = torch.nonzero(active & (completion_mask.sum(1) > 0)).squeeze(1)
    micro_batches = [rows[i:i + args.micro_batch] for i in range(0, len(rows), args.micro_batch)]
    token_share = completion_mask.sum(1) / completion_mask.sum().clamp_min(1)  # [B]; token-mean
    row_share = torch.full_like(token_share, 1.0 / len(token_share))             # seq-mean-* modes
    share = token_share if args.loss_agg == "token-mean" else row_share

    # old (sampling-policy) and reference log-probs
    on_policy = old_logprobs is None and args.ppo_epochs == 1
    with torch.no_grad(), precision(args):
        ref_logprobs = None if ref_model is None else token_logprobs(
            ref_model, input_ids, attention_mask, completion_mask, temperature=args.temperature,
            micro_batch=args.micro_batch)
        # on-policy (1 epoch): the first training forward's detached log-probs ARE pi_old (filled below);
        # with more epochs pi_old must be fixed before the first update: one no-grad pass
        if old_logprobs is None:
            old_logprobs = torch.zeros_like(completion_mask)
            if args.ppo_epochs > 1 and len(rows):
                old_logprobs[rows] = token_logprobs(model, input_ids[rows], attention_mask[rows], completion_mask[rows],
                                                    temperature=args.temperature, micro_batch=args.micro_batch)

    # the passes: one optimizer step each
    num_passes = 2 if args.lopti_eta > 0 else 1
    stat_keys = ["clip_frac_low", "clip_frac_high", "ratio_mean", "ratio_max"] + ["kl"] * (ref_model is not None)
    sums = dict.fromkeys(stat_keys, 0.0)  # policy_loss stats summed over micro-batches, weighted by share
    loss_sum, entropy_sum, low_tokens, grad_norms = 0.0, 0.0, 0.0, []
    for epoch in range(args.ppo_epochs):
        for pass_index in range(num_passes):
            optimizer.zero_grad(set_to_none=True)
            for mb in micro_batches:
                first_forward = epoch == 0 and pass_index == 0
                mask = completion_mask[mb]
                with clock("log-prob forward"), precision(args):
                    out = token_logprobs(model, input_ids[mb], attention_mask[mb], mask,
                                         temperature=args.temperature, with_entropy=first_forward)
                logprobs, entropy = out if first_forward else (out, None)
                if first_forward and on_policy:
                    old_logprobs[mb] = logprobs.detach()
                old = old_logprobs[mb]
                old_probs = old.exp()  # p_old of each sampled token
                token_adv = reweight_advantages(advantages[mb], old_probs, mask, args.alpha)  # AR; alpha=0: same
                _, pass_adv, pass_mask = lopti_passes(token_adv, old_probs, mask, args.lopti_eta,
                                                      args.lopti_order)[pass_index]
                loss, stats = policy_loss(logprobs, old, pass_adv, mask, clip_low=args.clip_low,
                                          clip_high=args.clip_high, dual_clip=args.dual_clip,
                                          ref_logprobs=None if ref_logprobs is None else ref_logprobs[mb],
                                          kl_coef=args.kl_coef, kl_mask=pass_mask, loss_agg=args.loss_agg,
                                          norm_constant=args.max_new_tokens)
                weight = share[mb].sum()
                (loss * weight).backward()  # sum over micro-batches = the loss of the whole batch
                loss_sum += loss.item() * weight.item()
                for key, value in stats.items():
                    sums[key] = sums.get(key, 0.0) + value * weight.item()
                if first_forward:
                    entropy_sum += (entropy * mask).sum().item()
                    low_tokens += isolation_masks(old_probs, mask, max(args.lopti_eta, 0.0))[0].sum().item()
            grad_norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip).item())
            optimizer.step()

    updates = args.ppo_epochs * num_passes
    forwarded_tokens = max(completion_mask[rows].sum().item(), 1.0)
    forwarded_share = max(share[rows].sum().item(), 1e-12)  # stats are means over the forwarded tokens
    return {"loss": loss_sum / updates, **{key: value / updates / forwarded_share for key, value in sums.items()},
            "entropy": entropy_sum / forwarded_tokens, "lopti_low_share": low_tokens / forwarded_tokens,
            "grad_norm": sum(grad_norms) / len(grad_norms)}


def rollout_stats(task, rollouts, rewards, advantages, num_generations):
    """The batch's metrics before the update: rewards, pass rate, zero-variance groups, lengths."""
    group_rewards = rewards.view(-1, num_generations)  # [prompts, M]
    return {"reward_mean": rewards.mean().item(), "pass_rate": (rewards >= task.pass_threshold).float().mean().item(),
            "zero_var_share": (group_rewards.max(1).values == group_rewards.min(1).values).float().mean().item(),
            "adv_abs_mean": advantages.abs().mean().item(),
            "response_length": rollouts.completion_mask.sum().item() / len(rewards),
            "truncated_share": rollouts.truncated.float().mean().item()}


# --------------------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------------------
def main(argv=None):
    args = parse_args(argv)
    transformers.utils.logging.disable_progress_bar()  # our tqdm bar is the only one
    os.makedirs(args.output_dir, exist_ok=True)
    metrics_path = os.path.join(args.output_dir, "metrics.jsonl")
    if args.threads or args.model == "tiny":
        torch.set_num_threads(args.threads or 1)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    device = torch.device(args.device)

    # --- task, policy, warm start (tiny only), reference policy (only when kl_coef > 0) ---------------------
    try:
        task = tasks.get_task(args.task, data=args.data, **args.task_options)
        model, tokenizer = load_policy(args.resume or args.model, device=device, alphabet=tasks.COMPACT_ALPHABET,
                                       tiny_hidden=args.tiny_hidden, tiny_layers=args.tiny_layers, seed=args.seed)
    except ValueError as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        sys.exit(2)
    eval_examples = task.examples("test", args.eval_size, seed=args.seed)
    initial_dir = args.model
    if args.model == "tiny":
        initial_dir = warm_start_dir(args)  # cached: a second run with the same settings skips it
        if args.resume is None and args.warm_start_steps > 0:
            model, _ = warm_start(model, tokenizer, task, cache_dir=initial_dir, max_steps=args.warm_start_steps,
                                  target_pass=args.warm_start_target, max_new_tokens=args.max_new_tokens,
                                  eval_examples=task.examples("test", args.eval_size, seed=args.seed + 1),
                                  seed=args.seed, log=tqdm.write)
        elif args.resume is None:
            model.save_pretrained(initial_dir)  # no warm start: the initial (reference) policy is the random init
            tokenizer.save_pretrained(initial_dir)
    if args.model != "tiny" and args.style == "chat" and not getattr(tokenizer, "chat_template", None):
        tqdm.write(f"warning: {args.model} has no chat template; the prompts are the messages' plain text")
    ref_model = None
    if args.kl_coef > 0:
        ref_model = copy.deepcopy(model) if args.resume is None else load_policy(initial_dir, device=device)[0]
        ref_model.eval().requires_grad_(False)

    # --- optimizer and trainer state (fresh or resumed) ------------------------------------------------
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    torch.manual_seed(args.seed)  # the RL phase starts from the same RNG state whether or not warm start ran
    start_step, state = 0, {}
    if args.resume:
        state = torch.load(os.path.join(args.resume, "trainer_state.pt"), weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        restore_rng(state)
        start_step = state["step"]
        kept = [line for line in open(metrics_path)] if os.path.exists(metrics_path) else []
        with open(metrics_path, "w") as f:  # drop rows written after this checkpoint
            f.writelines(line for line in kept if json.loads(line)["step"] <= start_step)
    else:
        open(metrics_path, "w").close()
        with precision(args):
            state["initial_eval"] = evaluate(model, tokenizer, task, eval_examples, style=args.style,
                                             max_new_tokens=args.max_new_tokens)
        write_metrics(metrics_path, {"step": 0, "eval": True, **state["initial_eval"]})
    final_eval = state.get("initial_eval")

    stop_requested = []
    def request_stop(signum, frame):  # Ctrl-C: finish the step, save a checkpoint, exit; twice: abort now
        if stop_requested:
            raise KeyboardInterrupt
        stop_requested.append(True)
        tqdm.write("Ctrl-C: saving a checkpoint after this step (press again to abort)")
    previous_handler = signal.signal(signal.SIGINT, request_stop)

    step = start_step
    bar = tqdm(range(start_step + 1, args.steps + 1), initial=start_step, total=args.steps, desc="RL")
    for step in bar:
        # --- 1. rollouts, rewards, group advantages ---------------------------------------------------------
        t0 = time.time()
        for group in optimizer.param_groups:  # linear warm-up, then constant (no dependence on --steps)
            group["lr"] = args.lr * min(1.0, step / (args.warmup_steps + 1))
        examples = task.examples("train", args.prompts_per_step, seed=args.seed * 1_000_003 + step)  # (seed, step)
        rollouts, rewards, advantages = collect_rollouts(model, tokenizer, task, examples, args)
        t1 = time.time()

        # --- 2. the update: AR, then one clipped-surrogate pass or Lopti's two, ppo_epochs times --------------
        stats = update_policy(model, optimizer, rollouts, advantages, args, ref_model=ref_model)
        t2 = time.time()

        # --- 3. metrics, evaluation, checkpoint ----------------------------------------------------------------
        n_tokens = rollouts.completion_mask.sum().item()
        row = {"step": step, **rollout_stats(task, rollouts, rewards, advantages, args.num_generations), **stats,
               "lr": optimizer.param_groups[0]["lr"], "rollout_s": t1 - t0, "update_s": t2 - t1,
               "tokens_per_s": n_tokens / max(t2 - t0, 1e-9)}
        write_metrics(metrics_path, row)
        bar.set_postfix(reward=f"{row['reward_mean']:.3f}", pass_rate=f"{row['pass_rate']:.3f}")
        if step % args.eval_every == 0 or step == args.steps:
            with precision(args):
                final_eval = evaluate(model, tokenizer, task, eval_examples, style=args.style,
                                      max_new_tokens=args.max_new_tokens)
            write_metrics(metrics_path, {"step": step, "eval": True, **final_eval})
            tqdm.write(f"step {step}: held-out pass@1 {final_eval['pass@1']:.3f}  reward {final_eval['reward']:.3f}")
        if step % args.save_every == 0 or step == args.steps or stop_requested:
            save_checkpoint(args.output_dir, step, model, tokenizer, optimizer, state)
        if stop_requested:
            tqdm.write(f"stopped at step {step}; continue with --resume {os.path.join(args.output_dir, 'latest')}")
            break
    bar.close()
    signal.signal(signal.SIGINT, previous_handler)

    # --- 4. before / after ----------------------------------------------------------------------------------
    before = state["initial_eval"]
    rows = [("before RL" + (" (after warm start)" if args.model == "tiny" else ""), before),
            (f"after RL (step {step})", final_eval)]
    print(f"\n{f'held-out, greedy, {len(eval_examples)} prompts':<32}{'pass@1':>8}{'reward':>8}")
    for label, result in rows:
        print(f"{label:<32}{result['pass@1']:>8.3f}{result['reward']:>8.3f}")
    print(f"metrics: {metrics_path}")
    return {"before": before, "after": final_eval, "metrics_path": metrics_path}


if __name__ == "__main__":
    main()
