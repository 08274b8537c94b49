"""The memory plan (harness/memory.py) against a measured peak: one RL step's rollout and update phases.

    python benchmarks/memory_check.py --model smollm2 --prompts 4 -M 4 --max-new-tokens 32      # one setting
    python benchmarks/memory_check.py --model smollm2 --gradient-checkpointing               # the same, checkpointed
    python benchmarks/memory_check.py --table smollm2-cpu          # the docs' settings, each in a fresh process
    python benchmarks/memory_check.py --model qwen2.5-0.5b --device cuda --prompts 64 -M 8 --max-new-tokens 256
    python benchmarks/memory_check.py --cards                      # docs' per-card table of the recipes (planned)

Models: tiny (random init), smollm2, or a random Qwen2.5 shape (random_model_step.py's); a graded
reward, so every row trains. One step after a warm-up one; measured: CUDA's peak allocated memory
or a CPU's peak RSS per phase less the RSS before the weights; predicted: memory_plan (docs/).
"""
import argparse
import ctypes
import dataclasses
import json
import os
import random
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere
import train  # noqa: E402
from experiments import output_file  # noqa: E402
from harness import memory, policy  # noqa: E402
from harness.config import Config  # noqa: E402

TINY = "--model tiny --tiny-hidden 512 --tiny-layers 6 --prompts 16 -M 8 --prompt-digits 48 "
SMOLLM2 = "--model smollm2 --prompts 4 -M 4 --prompt-digits 64 --max-new-tokens 32 --micro-batch 16"
TABLES = {  # the docs' validation settings (docs/performance.md, "What fits a card"): flags on top of the base
    "tiny-cpu": (TINY + "--max-new-tokens 48 --micro-batch 64",
                 ["", "--gradient-checkpointing", "--micro-batch 16",
                  "--lora-rank 16 --kl-coef 0.01", "-M 16 --prompts 8", "--kl-coef 0.01"]),
    "smollm2-cpu": (SMOLLM2, ["", "--gradient-checkpointing", "--micro-batch 4",
                              "--max-new-tokens 64", "-M 8 --prompts 2",
                              "--lora-rank 16 --kl-coef 0.01", "--kl-coef 0.01",
                              "--rollout-batch 4"]),
    # --param-dtype bf16 (issue 41): bf16 storage alone, with checkpointing, with the reference copy, with LoRA
    "tiny-cpu-bf16": (TINY + "--max-new-tokens 48 --micro-batch 64 --param-dtype bf16",
                      ["", "--gradient-checkpointing", "--kl-coef 0.01",
                       "--lora-rank 16 --kl-coef 0.01"]),
    "smollm2-cpu-bf16": (SMOLLM2 + " --param-dtype bf16",
                         ["", "--gradient-checkpointing", "--kl-coef 0.01",
                          "--lora-rank 16 --kl-coef 0.01 --gradient-checkpointing"]),
    # issue 41's options: NF4 base under LoRA, 8-bit moments (plan frozen before: docs/)
    "tiny-cpu-41": (TINY + "--max-new-tokens 48 --micro-batch 64 --param-dtype bf16",
                    ["--lora-rank 16 --kl-coef 0.01 --base-dtype nf4",
                     "--lora-rank 16 --kl-coef 0.01 --base-dtype nf4 --gradient-checkpointing",
                     "--optimizer adamw8bit", "--optimizer adamw8bit --gradient-checkpointing"]),
    "smollm2-cpu-41": (SMOLLM2 + " --param-dtype bf16",
                       ["--lora-rank 16 --kl-coef 0.01 --base-dtype nf4",
                        "--lora-rank 16 --kl-coef 0.01 --base-dtype nf4 --gradient-checkpointing",
                        "--optimizer adamw8bit", "--lora-rank 16 --kl-coef 0.01",
                        "--lora-rank 16 --kl-coef 0.01 --gradient-checkpointing"]),
    # issue 38 item 7: the plan out of sample (frozen before these were measured: docs/)
    "tiny-cpu-oos": ("--model tiny --tiny-hidden 384 --tiny-layers 4 --prompts 16 -M 8 "
                     "--prompt-digits 48 --max-new-tokens 48 --micro-batch 64",
                     ["", "-M 4 --prompts 32", "--prompt-digits 96 --max-new-tokens 24",
                      "--micro-batch 8", "--rollout-batch 32",
                      "--lora-rank 8 --kl-coef 0.01 --gradient-checkpointing"]),
    # issue 38 item 7, LoRA: the plan frozen at mem-lora, before these were measured
    "tiny-cpu-oos-lora": ("--model tiny --tiny-hidden 256 --tiny-layers 8 --prompts 8 -M 8 "
                          "--prompt-digits 40 --max-new-tokens 40 --micro-batch 32",
                          ["--lora-rank 4 --kl-coef 0.01",
                           "--lora-rank 32 --gradient-checkpointing",
                           "--lora-rank 16 --kl-coef 0.01 --gradient-checkpointing "
                           "--micro-batch 16 -M 4 --prompts 16"]),
    # the same, on SmolLM2 (GQA: 9 query heads on 3 KV heads), the plan frozen at 634e2db
    "smollm2-cpu-oos-lora": (SMOLLM2,
                             ["--lora-rank 8 --kl-coef 0.01 --prompts 2 -M 8 --max-new-tokens 48",
                              "--lora-rank 32 --micro-batch 8 --prompt-digits 32"]),
    # issue 52's options out of sample: bf16 without masters, the step in backward, 8-bit moments
    "tiny-cpu-52": ("--model tiny --tiny-hidden 448 --tiny-layers 5 --prompts 16 -M 8 "
                    "--prompt-digits 48 --max-new-tokens 48 --micro-batch 128",
                    ["--param-dtype bf16-sr", "--param-dtype bf16-sr --step-in-backward",
                     "--step-in-backward",
                     "--param-dtype bf16-sr --step-in-backward --kl-coef 0.01",
                     "--param-dtype bf16-sr --step-in-backward --optimizer adamw8bit "
                     "--gradient-checkpointing"]),
    "smollm2-cpu-52": (SMOLLM2 + " --param-dtype bf16-sr",
                       ["", "--step-in-backward",
                        "--step-in-backward --optimizer adamw8bit --gradient-checkpointing"]),
}
TABLES = {name: (base.split(), [setting.split() for setting in settings])
          for name, (base, settings) in TABLES.items()}  # each a list of argv words


# a fixed mmap threshold (glibc's default rises as big blocks are freed, which stay in the RSS):
# the RSS follows the live tensors, as the plan counts them. Set before the process starts.
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "131072"}


class DigitsTask:
    """Prompts of random digits; reward = the share of even digits in the completion (graded, in [0, 1])."""
    name, pass_threshold = "even_digits", 0.5

    def __init__(self, digits):
        self.digits = digits

    def examples(self, split, n, seed):
        rng = random.Random(f"{split}-{seed}")
        return [{"text": "".join(rng.choice("0123456789") for _ in range(self.digits))} for _ in range(n)]

    def prompt(self, example, style="compact"):
        return example["text"] + ">"

    def reward(self, completion, example, style="compact"):
        digits = [c for c in completion if c.isdigit()]
        return sum(int(c) % 2 == 0 for c in digits) / max(len(digits), 1)


def rss_bytes(field):
    with open("/proc/self/status") as f:  # Linux only
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def reset_peak(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    else:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # what the last phase freed goes back: RSS = live memory
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS


def peak(device, baseline):
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - baseline
    return rss_bytes("VmHWM") - baseline


def build(args, config):
    from harness import tiny
    if args.model == "tiny":
        tokenizer = tiny.build_char_tokenizer()
        model = tiny.build_tiny_model(tokenizer, hidden_size=args.tiny_hidden, num_layers=args.tiny_layers)
        task = DigitsTask(args.prompt_digits)
    elif args.model == "smollm2":
        from harness.model import load_policy
        model, tokenizer = load_policy("smollm2")
        task = DigitsTask(args.prompt_digits)
    else:
        from benchmarks.random_model_step import GradedTask, build as build_shape
        model, tokenizer = build_shape(args.model, device=args.device)
        task = GradedTask()
    model = model.to(args.device).to(policy.storage_dtype(config))  # as policy.build_policy: cast, then the options
    return policy.memory_options(config, model).train(), tokenizer, task


def tensor_bytes(tensor):
    """The bytes a tensor stores: a tensor subclass's (torchao's NF4Tensor) inner tensors', not its logical size."""
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) and hasattr(tensor, "__tensor_flatten__"):
        return sum(tensor_bytes(getattr(tensor, name)) for name in tensor.__tensor_flatten__()[0])
    return tensor.numel() * tensor.element_size()


def reference_of(model, config):
    if config.kl_coef <= 0:
        return None
    import copy
    from harness.model import without_adapters
    return (without_adapters(model) if config.lora_rank else copy.deepcopy(model)).eval().requires_grad_(False)


def step_config(args, **fields):
    lean = {"step_in_backward": True, "grad_clip": 0.0} if args.step_in_backward else {}
    return Config(style="compact", eval_size=1, num_generations=args.M, prompts_per_step=args.prompts,
                  max_new_tokens=args.max_new_tokens, rollout_batch=args.rollout_batch,
                  micro_batch=args.micro_batch, kl_coef=args.kl_coef, lora_rank=args.lora_rank,
                  gradient_checkpointing=args.gradient_checkpointing, param_dtype=args.param_dtype,
                  optimizer=args.optimizer, base_dtype=args.base_dtype,
                  optimizer_offload=args.optimizer_offload, **{**lean, **fields})


def measure(args):
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = args.dtype or ("bf16" if args.device.startswith("cuda") or args.param_dtype != "fp32" else "fp32")
    config = step_config(args, dtype=dtype, device=args.device, lr=1e-5).validate()
    model, tokenizer, task = build(args, config)
    weight_bytes = sum(map(tensor_bytes, [*model.parameters(), *model.buffers()]))
    if args.device.startswith("cuda"):
        baseline = 0  # torch's allocator counts only tensors: the weights are part of the plan
    else:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # give back what loading freed (a .gguf's dequantization)
        baseline = rss_bytes("VmRSS") - weight_bytes
    reference = reference_of(model, config)  # after the baseline: the plan counts its copy
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = policy.adamw_class(config)(trained, lr=config.lr, weight_decay=config.weight_decay)
    phases, seconds, widths = {}, {}, None
    for step in range(2):  # step 0 allocates AdamW's state; step 1 is measured
        reset_peak(args.device)
        start = time.perf_counter()
        rollouts, rewards, advantages = train.collect_rollouts(model, tokenizer, task,
                                                               task.examples("train", args.prompts, step), config)
        phases["rollout"], seconds["rollout"] = peak(args.device, baseline), time.perf_counter() - start
        reset_peak(args.device)
        start = time.perf_counter()
        train.update_batch(model, optimizer, rollouts.input_ids, rollouts.attention_mask, rollouts.completion_mask,
                           advantages, config, ref_model=reference)
        phases["update"], seconds["update"] = peak(args.device, baseline), time.perf_counter() - start
        width = rollouts.completion_mask.shape[1]
        widths = (rollouts.input_ids.shape[1] - width, width, rollouts.completion_mask.sum(1).mean().item())
    shape = memory.shape_from_config(model.config)
    plan = memory.memory_plan(shape, dataclasses.replace(config, max_new_tokens=widths[1]), widths[0])
    return {"model": args.model, "setting": args.setting, "prompt_tokens": widths[0],
            "completion_tokens": widths[1], "mean_completion": widths[2], "weights_measured": weight_bytes,
            "plan": {k: v for k, v in plan.items() if k != "assumed"},
            "measured": {"rollout_peak": phases["rollout"], "update_peak": phases["update"],
                         "peak": max(phases.values())},
            "seconds": seconds, "baseline": baseline,
            "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_", "glibc default"), "dtype": dtype,
            "device": args.device, "param_dtype": args.param_dtype, "optimizer": args.optimizer,
            "base_dtype": args.base_dtype, "optimizer_offload": args.optimizer_offload,
            "step_in_backward": args.step_in_backward}


def plan_only(args):
    from transformers import Qwen2Config

    from benchmarks.random_model_step import SHAPES
    config = step_config(args, dtype=args.dtype or "bf16", device=args.device).validate()
    plan = memory.memory_plan(memory.shape_from_config(Qwen2Config(**SHAPES[args.model])), config, 32)
    print(f"PLAN {args.model} {args.setting or 'base'}: planned {plan['peak'] / 2**30:.2f} GiB (rollout "
          f"{plan['rollout_peak'] / 2**30:.2f}, update {plan['update_peak'] / 2**30:.2f})"
          + (f", {plan['offloaded'] / 2**30:.2f} GiB in CPU memory" if plan["offloaded"] else ""))
    return plan


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny", help="tiny, smollm2, or a shape of benchmarks/random_model_step.py")
    p.add_argument("--tiny-hidden", type=int, default=192)
    p.add_argument("--tiny-layers", type=int, default=4)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("-M", type=int, default=4)
    p.add_argument("--prompt-digits", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--rollout-batch", type=int, default=None)
    p.add_argument("--kl-coef", type=float, default=0.0)
    p.add_argument("--lora-rank", type=int, default=0)
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--param-dtype", default="fp32", choices=("fp32", "bf16", "bf16-sr"))
    p.add_argument("--step-in-backward", action="store_true", help="each weight stepped in backward (no clipping)")
    p.add_argument("--optimizer", default="adamw", choices=("adamw", "adamw8bit"))
    p.add_argument("--base-dtype", default=None, choices=("nf4",))
    p.add_argument("--optimizer-offload", action="store_true", help="a CUDA run's states in CPU memory")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, choices=("bf16", "fp32"))
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--table", choices=sorted(TABLES), help="run the docs' settings, each in a fresh process")
    p.add_argument("--replan", metavar="LOG", help="with --table: the table from a MEMORY_CHECK_LOG, replanned")
    p.add_argument("--cards", action="store_true", help="print the per-card table of the paper recipes (planned)")
    p.add_argument("--targets", action="store_true", help="print what the plan says of docs' per-card targets")
    p.add_argument("--recipe-lines", action="store_true", help="write the recipes' memory lines")
    p.add_argument("--plan-only", action="store_true", help="print this setting's plan")
    p.add_argument("--setting", default="", help=argparse.SUPPRESS)  # the label of a table row
    return p


def recipe_paths():
    """recipes/*.sh that run train.py (the verl_* ones launch verl)."""
    import glob
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recipes")
    return sorted(p for p in glob.glob(os.path.join(folder, "*.sh")) if "verl_" not in p)


def recipe_config(path):
    import re
    import shlex
    from harness.flags import parse_args
    block = re.search(r"^args=\($(.*?)^\)$", open(path).read(), re.S | re.M).group(1)
    block = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: m.group(2), block)
    argv = [token for line in block.splitlines() for token in shlex.split(line, comments=True)]
    return dataclasses.replace(parse_args(argv), dtype="bf16", device="cuda")


MEMORY_LINE = "# Memory (its plan"


def recipe_memory_line(path, cards=(80, 24)):
    """Each recipe's comment line: the plan's peak as written on a CUDA card, what fits `cards`."""
    config = recipe_config(path)
    shape = memory.model_shape(config)
    P = config.max_prompt_length or memory.PROMPT_GUESS["chat"]
    plan = memory.memory_plan(shape, config, P)
    fits = []
    for card in cards:
        changes, fitted = memory.fitting_settings(shape, config, P, card * 1e9)
        fits.append(f"{card} GB " + ("as written" if changes == {} else f"with {memory.flags_text(changes)}"
                                     if changes is not None else
                                     f"no ({(memory.needed(fitted) - card * 1e9) / 1e9:.1f} GB over)"))
    return (f"{MEMORY_LINE}: --dry-run --device cuda): peak {plan['peak'] / 1e9:.1f} GB as written; fits "
            + "; ".join(fits))


SHORT = {"gradient_checkpointing": "ckpt", "param_dtype": "bf16", "optimizer": "8-bit", "optimizer_offload": "offload",
         "base_dtype": "NF4", "step_in_backward": "in-backward", "kl_coef": "no KL"}  # the table's names


def short_names(changes):
    return [("bf16-sr" if key == "param_dtype" and changes[key] == "bf16-sr" else short)
            for key, short in SHORT.items() if key in changes]


def card_table(cards=(24, 48, 80)):
    recipes = recipe_paths()
    print("| recipe (prompts x M, prompt + completion tokens) | " + " | ".join(
        f"{card} GB full | {card} GB LoRA" for card in cards) + " |")
    print("|---|" + "---|" * 2 * len(cards))
    for path in recipes:
        config = recipe_config(path)
        P = config.max_prompt_length or memory.PROMPT_GUESS["chat"]
        cells = []
        for card in cards:
            for lora in (False, True):
                base = dataclasses.replace(config, lora_rank=16) if lora else config
                best = "none"
                for name, shape in memory.QWEN25.items():  # smallest to largest
                    changes, _ = memory.fitting_settings(shape, base, P, card * 1e9,
                                                         allowed=[s for s in memory.STEPS if s != "lora_rank"])
                    if changes is not None:
                        used = short_names(changes)
                        best = name.split("-")[1].upper() + (f" ({', '.join(used)})" if used else "")
                cells.append(best)
        name = os.path.basename(path)[:-3]
        print(f"| {name} ({config.prompts_per_step} x {config.num_generations}, {P} + {config.max_new_tokens}) | "
              + " | ".join(cells) + " |")


NO_OFFLOAD = [s for s in memory.STEPS if s not in ("lora_rank", "optimizer_offload")]
TARGETS = [("qwen2.5-3b", False, 24, NO_OFFLOAD),  # issue 41's: 3B full without CPU offload,
           ("qwen2.5-7b", True, 24, [s for s in memory.STEPS if s != "lora_rank"]),  # 7B LoRA (any option),
           ("qwen2.5-7b", False, 80, [s for s in memory.STEPS if s != "lora_rank"])]  # 7B full, offload allowed


def targets():
    """docs/performance.md's per-card targets (countdown recipe): what fits, or by how much not."""
    config = recipe_config(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recipes",
                                        "softmaxgrpo_countdown.sh"))
    probes = [(*target, {}) for target in TARGETS] + [  # why 3B full misses 24 GB: each held term taken away
        ("qwen2.5-3b", False, 24, [s for s in memory.STEPS if s != "lora_rank"], {}),
        ("qwen2.5-3b", False, 24, NO_OFFLOAD, {"kl_coef": 0.0}),
        ("qwen2.5-3b", False, 24, [s for s in memory.STEPS if s != "lora_rank"], {"kl_coef": 0.0}),
        # issue 52: no masters (bf16-sr) and the step in backward, each alone and together, with the reference
        ("qwen2.5-3b", False, 24, [s for s in NO_OFFLOAD if s != "step_in_backward"], {}),
        ("qwen2.5-3b", False, 24, [s for s in NO_OFFLOAD if s != "stochastic_rounding"], {}),
        ("qwen2.5-3b", False, 24, NO_OFFLOAD + ["kl_coef"], {})]
    for name, lora, card, allowed, other in probes:
        base = dataclasses.replace(config, lora_rank=16 if lora else 0, **other)
        shape = memory.QWEN25[name]
        fit = memory.fitting_settings(shape, base, config.max_prompt_length, card * 1e9, allowed=allowed)
        left_out = [s for s in ("stochastic_rounding", "step_in_backward") if s not in allowed]
        plan = memory.memory_plan(shape, base, config.max_prompt_length)
        print(f"{name} {'LoRA 16' if lora else 'full'} on {card} GB"
              f"{'' if 'optimizer_offload' in allowed else ' (no CPU offload)'}"
              f"{f' (not: {chr(44).join(left_out)})' if left_out else ''}"
              f"{', --kl-coef 0 allowed' if 'kl_coef' in allowed else ''}"
              f"{''.join(f', --{k.replace(chr(95), chr(45))} {v:g}' for k, v in other.items())}: "
              f"{memory.fit_text(plan, card * 1e9, fit, kl_tried='kl_coef' in allowed)}")
        print("    its plan's parts, GB: " + ", ".join(f"{part} {fit[1][part] / 1e9:.2f}" for part in
                                                       (*memory.PARTS, "offloaded", "peak") if fit[1][part]))


def table_row(r, plan):
    mib = lambda x: f"{x / 2**20:,.0f}"  # noqa: E731
    got = r["measured"]
    return (f"| {r['setting'] or 'base'} (P {r['prompt_tokens']}, T {r['completion_tokens']}) | "
            f"{mib(plan['peak'])} ({mib(plan['rollout_peak'])} / {mib(plan['update_peak'])}) | "
            f"{mib(got['peak'])} ({mib(got['rollout_peak'])} / {mib(got['update_peak'])}) | "
            f"{plan['peak'] / got['peak'] - 1:+.0%} | {r['seconds']['rollout']:.1f} + {r['seconds']['update']:.1f} |")


def replan(table, log):
    """The table again from a MEMORY_CHECK_LOG file, each prediction recomputed with today's harness/memory.py."""
    base, settings = TABLES[table]
    for index, line in enumerate(open(log)):
        r = json.loads(line)
        r["setting"] = r["setting"] or " ".join(settings[index])  # (logs written before labels were kept)
        args = parser().parse_args(base + ([] if r["setting"] in ("", "base") else r["setting"].split()))
        config = step_config(args, max_new_tokens=r["completion_tokens"], dtype=r["dtype"], device=r["device"],
                             param_dtype=r.get("param_dtype", "fp32"), optimizer=r.get("optimizer", "adamw"),
                             base_dtype=r.get("base_dtype"), optimizer_offload=r.get("optimizer_offload", False))
        shape = memory.model_shape(dataclasses.replace(config, model=args.model, tiny_hidden=args.tiny_hidden,
                                                       tiny_layers=args.tiny_layers))
        print(table_row(r, memory.memory_plan(shape, config, r["prompt_tokens"])))


def main(argv=None):
    args = parser().parse_args(argv)
    if args.cards:
        return card_table()
    if args.targets:
        return targets()
    if args.recipe_lines:
        for path in recipe_paths():
            lines = [line for line in open(path).read().splitlines() if not line.startswith(MEMORY_LINE)]
            lines.insert(lines.index("set -euo pipefail"), recipe_memory_line(path))
            with output_file(path) as f:  # written beside and renamed, never through a link or FIFO
                f.write("\n".join(lines) + "\n")
            print(lines[lines.index("set -euo pipefail") - 1])
        return
    if args.replan:
        return replan(args.table, args.replan)
    if args.plan_only:
        return plan_only(args)
    if not args.table:
        print("RESULT " + json.dumps(measure(args)), flush=True)
        return
    base, settings = TABLES[args.table]
    extra = [] if args.threads is None else ["--threads", str(args.threads)]
    print("| setting | planned peak (rollout / update), MiB | measured peak (rollout / update), MiB | plan error "
          "| s: rollout + update |")
    print("|---|---|---|---|---|")
    for setting in settings:
        command = [sys.executable, os.path.abspath(__file__), *base, *setting, *extra, "--device", args.device,
                   "--setting=" + (" ".join(setting) or "base")]
        proc = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **MALLOC})
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode or not lines:
            print(f"| {' '.join(setting) or 'base'} | failed: {proc.stderr.strip().splitlines()[-1:]} |||")
            continue
        r = json.loads(lines[0][7:])
        print(table_row(r, r["plan"]), flush=True)
        with open(os.environ.get("MEMORY_CHECK_LOG", os.devnull), "a") as f:
            f.write(json.dumps(log_row(r, command)) + "\n")


def log_row(result, command):
    from lab.reproduce import provenance
    return {**result, **provenance(), "command": " ".join(command[1:])}


if __name__ == "__main__":
    main()
