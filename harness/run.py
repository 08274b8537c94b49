"""A training run's lifecycle, beside train.py's loop: settings, the policy, metrics, evals, checkpoints, Ctrl-C.

    config, tokenizer, task, prompts = settle(config)       # every setting decided once, then frozen
    with start(config) as state:                            # the folder locked; fresh (never over a run) or resumed
        model, ref_model = build_policy(config, tokenizer, task)
        state.begin(model, tokenizer, optimizer, evaluate)  # fresh: eval at step 0; resumed: state restored
        for step in range(state.step + 1, config.steps + 1):
            ...                                             # the RL step (train.py)
            state.log(row, tokens=...)                      # one row of metrics.jsonl
            if state.end_of_step(step):                     # eval and checkpoint when due; True after Ctrl-C
                break

Every file is written atomically (checkpoint.py), so a kill, a full disk or a read-only folder never loses what was
there. Problems a user can act on are one line: a RunError (the run's files: exit 1) or an InputError (a flag, the
model, the task or its data: exit 2), all raised before the first step except the disk's. A reader of the RL
algorithm can skip this file.
"""
import contextlib
import copy
import dataclasses
import functools
import json
import os
import random
import signal
import sys
import time
import uuid
from collections import defaultdict

import numpy as np
import torch
import transformers
from tqdm import tqdm

import tasks
from harness import advice, memory, report, tiny
from harness.checkpoint import (RunError, check_weights, checkpoint_step, checkpoint_steps, existing_copy,
                                holds_a_run, instead_of, later_checkpoints, load_trainer_state, locked, point_latest,
                                recover, refuse_planted_links, remove_run, restore_rng, rng_state, save_checkpoint,
                                tensor_problem, verify_checkpoint, what_is, write_failed)
from harness.lean_optimizer import LeanAdamW
from harness.master_weights import MasterWeights
from harness.metrics import append_metrics, metrics_rows, rewrite_metrics
from harness.config import Config, InputError, check_libraries, fixed_paths, require_library
from harness.model import (add_lora, base_changed, enable_checkpointing, load_adapters, load_policy, load_tokenizer,
                           policy_digest, quantize_base, without_adapters)
from harness.prompts import epoch_steps, training_prompts, within_context
from harness.rewards import RewardTimeout, Stopped, TimedRewards, timed_task, worker_recipe
from harness.watch import CONSTANT_CHECKED, MIN_PROMPTS, Watch, top_answer

TIMING_KEYS = ("rollout_s", "update_s", "tokens_per_s")  # the only metrics that differ between identical runs
SAMPLES_SHOWN = 3  # greedy completions printed at each eval (the first held-out prompts)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # each: finish the step, save, stop


def say(text):
    """A line on stdout that does not collide with the loop's progress bar (tqdm.write)."""
    tqdm.write(text)
    sys.stdout.flush()


@contextlib.contextmanager
def input_errors():
    """Around what reads the user's input (the model, the task, its data): a ValueError there is an InputError, an
    OSError a RunError, each one line. Used only before the first step: a ValueError in the loop is a bug in the
    code and keeps its traceback."""
    try:
        yield
    except (RunError, InputError):
        raise
    except (ValueError, RewardTimeout) as error:  # RewardTimeout: a task file's first rewards (check_protocol)
        raise InputError(str(error)) from None
    except OSError as error:
        raise RunError(f"{error.filename + ': ' if error.filename else ''}{error.strerror or error}") from None


@contextlib.contextmanager
def policy_load_errors(config):
    """Around loading the policy's tokenizer or weights: a resumed checkpoint is the run's own file (a RunError,
    exit 1, like its other files), any other source is the user's input (an InputError, exit 2)."""
    try:
        yield
    except ValueError as error:  # the checkpoint named once: model.py's message names it already, or not
        named = "" if str(error).startswith(str(config.resume)) else f"{config.resume}: "
        raise (RunError(f"{named}{error}; resume from another checkpoint") if config.resume else
               InputError(str(error))) from None


# ---------------------------------------------------------------------------------------------------------------
# Settings: decided once, before the run starts (config.load has merged a resumed run's)
# ---------------------------------------------------------------------------------------------------------------
def settle(config):
    """Every setting the run needs, decided once and frozen -> (config, tokenizer, task, prompts(step)).

    Decided here: --device/--dtype auto for this machine; for a fresh run, the prompt style from the tokenizer
    (compact for the tiny character vocabulary, which then gets tiny.CPU_DEFAULTS where the flags left them open),
    the task's reward rules and where the initial (reference) weights live; the step count of --epochs. With
    --dry-run nothing is loaded: (config, None, None, None), the style judged from the model's name. The run's
    folders are absolute from here on (config.fixed_paths), whatever a task does to the working directory."""
    config = hardware(fixed_paths(config, ("output_dir", "warm_start_cache", "resume")))
    run_folders(config)
    changed = base_changed(config, f"{config.resume}/run.json") if config.resume else None
    if changed:  # a resumed LoRA run loads its base from initial_policy: the one its adapters trained on
        raise RunError(changed)
    if not config.dry_run:
        check_libraries(config)  # a Config from Python; the command line's config.load checked it before torch
    with input_errors():
        with policy_load_errors(config):
            source = existing_copy(config.resume) if config.resume else config.model  # start() recovers it
            tokenizer = None if config.dry_run else \
                tiny.build_char_tokenizer() if source == "tiny" else load_tokenizer(source)
        if not config.resume:
            compact = config.model == "tiny" if tokenizer is None else tiny.prompt_style(tokenizer) == "compact"
            config = dataclasses.replace(config, style="compact" if compact else "chat")
            config = tiny.apply_cpu_defaults(config) if compact else config
        config = task_file(config)
        timed = functools.partial(timed_task, seconds=config.reward_timeout,  # a task file's first rewards too
                                  recipe=worker_recipe(config))  # harness/rewards.py: its worker process
        if config.dry_run:  # no data file is read (but a task file's): the steps --epochs sets from --train-size
            steps = epoch_steps(config, config.train_size // config.prompts_per_step) if config.epochs and \
                config.train_size else config.steps
            built = tasks.is_task_file(config.task) or (config.data is None and config.task not in tasks.NEEDS_DATA)
            task = tasks.get_task(config.task, data=config.data, wrap=timed, **config.task_options) if built else None
            prompts = None
        else:
            task = tasks.get_task(config.task, data=config.data, wrap=timed, **config.task_options)
            prompts, steps = training_prompts(task, tokenizer, config)
    changes = dict(steps=steps)
    if "wandb" in (config.report_to or "") and config.wandb_run_id is None:  # the W&B run a resume continues
        changes["wandb_run_id"] = uuid.uuid4().hex[:8]
    if task is not None:
        changes["rules"] = getattr(task, "rules", None) if config.style == "chat" else "compact"
    if not config.resume and not config.dry_run:
        changes["initial_policy"] = tiny.initial_policy_dir(config) if config.model == "tiny" else \
            os.path.abspath(config.model) if os.path.exists(config.model) else config.model
    config = dataclasses.replace(config, **changes)
    if config.memory_budget and not config.dry_run:  # before any weight loads (build_policy)
        within_budget(config)
    elif not config.dry_run:
        within_machine(config)
    return (config, tokenizer, None if config.dry_run else task, prompts)


def run_folders(config):
    """An InputError naming the flag when --output-dir or --warm-start-cache names something other than a folder
    (a file, a FIFO): said by the dry run too, before the run would fail on it."""
    for flag, path in (("--output-dir", config.output_dir), ("--warm-start-cache", config.warm_start_cache)):
        if path and os.path.lexists(path) and not os.path.isdir(path):  # a link to a folder is one
            raise InputError(f"{flag} {path} is {what_is(path)}, not a folder; name a folder (it is created if "
                             "missing)")


def task_file(config):
    """For a task file (tasks/custom.py): a copy of config holding the file's sha256. A resumed run names its file
    with --task again (config.named_task); when that file is not the one the run started with, a note says so."""
    if not tasks.is_task_file(config.task):
        return config
    digest = tasks.custom.file_sha256(tasks.custom.source_file(config.task))
    if config.resume and digest != config.task_file_sha256:
        say(f"note: {config.task} is not the file this run started with (sha256 {str(config.task_file_sha256)[:12]}"
            f"..., now {digest[:12]}...); resuming with it, as --task asks")
    return dataclasses.replace(config, task_file_sha256=digest)


def hardware(config):
    """A copy of config with --device and --dtype "auto" decided for this machine: bf16 on a CUDA card with bf16
    (Ampere and newer) or under --param-dtype bf16, else fp32. A card without it (a T4, Colab's free card, or a
    V100) gets fp32, not fp16 with a loss scaler: one precision path, no overflow to guard, at fp32's speed (a note
    says so). A dry run may name a device this machine lacks (--dry-run --device cuda on a laptop): it plans for a
    bf16 card."""
    device = config.device if config.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available() and not config.dry_run:
        raise InputError(f"--device {device}: this torch sees no CUDA device (torch {torch.__version__}); "
                         "use --device cpu")
    if device == "mps" and not torch.backends.mps.is_available():  # a dry run too: it plans CUDA cards only
        raise InputError(f"--device mps: this torch sees no MPS device (Apple silicon; torch {torch.__version__}); "
                         "use --device cpu")
    cuda = device.startswith("cuda")
    if config.optimizer_offload and not cuda:  # a dry run too: it plans only what the run would do
        raise InputError(f"--optimizer-offload moves the optimizer's states from a CUDA card to CPU memory; on "
                         f"--device {device} they are in that memory already: drop the flag (a dry run plans a "
                         "CUDA run with --device cuda)")
    bf16 = cuda and (not torch.cuda.is_available() or torch.cuda.is_bf16_supported())  # no CUDA: a dry run's plan
    if config.dtype == "auto" and cuda and not bf16:
        say(f"note: {torch.cuda.get_device_name(device)} has no bf16: --dtype auto computes in fp32 (slower than "
            "bf16; fp16 would need a loss scaler)")
    dtype = config.dtype if config.dtype != "auto" else "bf16" if bf16 or config.param_dtype != "fp32" else "fp32"
    return dataclasses.replace(config, device=device, dtype=dtype)


def print_settings(config):
    """--dry-run: the settled settings as JSON, without loading the model (a model other than "tiny" is taken to
    be a chat model; the tiny model's own settings are left out for it). -> the settings dict."""
    shown = {key: value for key, value in config.saved().items()
             if config.model == "tiny" or not key.startswith(("tiny_", "warm_start_"))}
    if config.lora_rank and not config.resume:
        dry_run_lora_targets(config)
    print(json.dumps(shown, indent=1, sort_keys=True))
    if config.model != "tiny":
        print(f"note: nothing was loaded; what {config.model} needs on a GPU at these settings (memory, time): "
              "docs/performance.md, \"One GPU\"", file=sys.stderr)
    print_memory_plan(config)
    return shown


def dry_run_lora_targets(config):
    """--dry-run --lora-rank: --lora-targets checked against the model's module names as the run's add_lora would
    (an InputError naming them), on its skeleton (harness/model.py's model_skeleton: its config, no weights). A
    config that cannot be read here (offline, not cached): a note, the names unchecked."""
    from harness.model import check_lora_targets, model_skeleton
    try:
        with torch.device("meta"):
            skeleton = tiny.build_tiny_model(tiny.build_char_tokenizer(), hidden_size=config.tiny_hidden,
                                             num_layers=config.tiny_layers) if config.model == "tiny" else None
        skeleton = skeleton or model_skeleton(config.model)
    except (ValueError, OSError, KeyError) as error:
        say(f"note: --lora-targets not checked: the config of {config.model} could not be read "
            f"({str(error).splitlines()[0] if str(error) else type(error).__name__})")
        return
    try:
        check_lora_targets(skeleton, config.lora_targets)
    except ValueError as error:
        raise InputError(str(error)) from None


def print_memory_plan(config):
    """--dry-run's memory plan (harness/memory.py) on stderr, from the model's config alone; with --memory-budget,
    the settings that fit it. A model whose config cannot be read here (offline, not cached) gets a note instead."""
    try:
        shape = memory.model_shape(config)
    except (ValueError, OSError, KeyError, AttributeError) as error:  # AttributeError: not a Llama-style config
        print(f"note: no memory plan: the config of {config.model} could not be read ({str(error).splitlines()[0]})",
              file=sys.stderr)
        return
    prompt_length = config.max_prompt_length or memory.PROMPT_GUESS[config.style]
    budget = memory.parse_size(config.memory_budget) if config.memory_budget else None
    allowed = memory.FULL_ONLY if config.memory_fit == "full" else memory.STEPS
    try:  # memory.check_inputs: a setting of the wrong type or range, named
        plan = memory.memory_plan(shape, config, prompt_length)
        fit = memory.fitting_settings(shape, config, prompt_length, budget, allowed=allowed) if budget else None
        modes = memory.mode_fits(shape, config, prompt_length, budget) if budget else None
    except ValueError as error:
        print(f"note: no {error}", file=sys.stderr)
        return
    gpu = config.device.startswith("cuda")  # the step's time: the GPU's estimate (a CPU's: benchmarks/step_time.py)
    print(memory.plan_text(plan, budget, fit) + (f"\n{memory.modes_text(modes, budget)}" if modes else "")
          + (f"\n{memory.step_time_text(shape, config, prompt_length)}{memory.never_on_gpu(vars(config))}"
             if gpu else "")
          + ("" if config.max_prompt_length else
             f"\n  (prompt length guessed: {prompt_length} tokens; --max-prompt-length sets it)"), file=sys.stderr)
    if not budget:
        over_machine(config, shape, plan, prompt_length, say=lambda line: print(line, file=sys.stderr))


def machine_memory(device):
    """(bytes, in words) of the memory a run on `device` has here: a CPU's total RAM, a CUDA device's memory;
    None where this machine cannot say (no such device, mps)."""
    if device == "cpu" and hasattr(os, "sysconf"):
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine's total RAM"
        except (ValueError, OSError):
            return None
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        if index < torch.cuda.device_count():
            properties = torch.cuda.get_device_properties(index)
            return properties.total_memory, f"{properties.name}'s memory"
    return None


def over_machine(config, shape, plan, prompt_length, say=say):
    """A plan larger than this machine's memory (machine_memory) said before the run starts, one note, with the
    settings that fit it (memory.fitting_settings): the plan errs by up to 20%, so a note, not a refusal."""
    machine = machine_memory(config.device)
    if machine is None or memory.needed(plan) <= machine[0]:
        return
    size, what = machine
    budget = f"{int(size / memory.GB * 10) / 10:g}GB"  # rounded down: a budget within the machine
    changes, _ = memory.fitting_settings(shape, config, prompt_length, memory.parse_size(budget))
    say(f"note: this run's memory plan needs {memory.needed(plan) / memory.GB:.3f} GB (peak "
        f"{plan['peak'] / memory.GB:.3f} GB + the plan's headroom), more than {what}, {budget}: it may run out of "
        "memory; " + ("nothing the plan tries fits it (fewer prompts per step, shorter completions or a smaller "
                      "model)" if changes is None else f"it fits with {memory.flags_text(changes)} (--dry-run "
                      f"--memory-budget {budget} prints what each costs)"))


def within_machine(config):
    """A run that trains without --memory-budget: its plan against this machine's memory (over_machine); silent
    when the model's config cannot be read or the plan fits."""
    try:
        shape = memory.model_shape(config)
        prompt_length = config.max_prompt_length or memory.PROMPT_GUESS[config.style]
        plan = memory.memory_plan(shape, config, prompt_length)
    except (ValueError, OSError, KeyError, AttributeError):  # as print_memory_plan: no plan, nothing to say
        return
    over_machine(config, shape, plan, prompt_length)


def within_budget(config):
    """--memory-budget on a run that trains: its plan (as --dry-run's) checked before any weight loads; one line,
    an InputError, when it does not fit with the plan's headroom. A model whose config cannot be read: a note."""
    try:
        shape = memory.model_shape(config)
    except (ValueError, OSError, KeyError, AttributeError) as error:
        say(f"note: --memory-budget not checked: the config of {config.model} could not be read "
            f"({str(error).splitlines()[0]})")
        return
    try:
        plan = memory.memory_plan(shape, config, config.max_prompt_length or memory.PROMPT_GUESS[config.style])
    except ValueError as error:  # memory.check_inputs
        raise InputError(f"--memory-budget {config.memory_budget}: no {error}") from None
    budget = memory.parse_size(config.memory_budget)
    if memory.needed(plan) > budget:
        raise InputError(f"--memory-budget {config.memory_budget}: this run's memory plan needs "
                         f"{memory.needed(plan) / memory.GB:.3f} GB ({memory.headroom_text(config.device)}; peak "
                         f"{plan['peak'] / memory.GB:.3f} GB); --dry-run --memory-budget {config.memory_budget} "
                         "prints the settings that fit")
    say(f"memory plan: peak {plan['peak'] / memory.GB:.3f} GB, needs {memory.needed(plan) / memory.GB:.3f} GB "
        f"of the --memory-budget {config.memory_budget}")


# ---------------------------------------------------------------------------------------------------------------
# The policy and the reference policy
# ---------------------------------------------------------------------------------------------------------------
def build_policy(config, tokenizer, task, *, log=print):
    """Seed everything, load the policy (a fresh tiny run: its warm start, tiny.py) and, when kl_coef > 0, the
    frozen reference policy (the initial weights). -> (model, ref_model or None)."""
    transformers.utils.logging.disable_progress_bar()  # the loop's tqdm bar is the only one
    torch.manual_seed(config.seed)
    random.seed(config.seed)
    np.random.seed(config.seed)
    device = torch.device(config.device)
    with policy_load_errors(config):
        if config.model == "tiny" and not config.resume:  # random init, then its warm start (below)
            model = tiny.build_tiny_model(tokenizer, hidden_size=config.tiny_hidden, num_layers=config.tiny_layers,
                                          seed=config.seed).to(device)
        else:  # a resumed LoRA run: its base (the initial weights), then its adapters (below)
            source = config.initial_policy if config.resume and config.lora_rank else config.resume or config.model
            model, _ = load_policy(source, device=device, tokenizer=tokenizer)
    if config.resume:  # its weights (a LoRA run's: its adapters) as saved, before anything runs on them
        check_weights(config.resume, storage_dtype(config), model)
    if config.threads:
        torch.set_num_threads(config.threads)
    if not config.resume and config.model == "tiny":
        model = tiny.prepare(config, model, tokenizer, task, log=log)
    elif not config.resume and config.style == "chat" and not getattr(tokenizer, "chat_template", None):
        log(f"note: {config.model} has no chat template; prompts are a plain-text User/Assistant conversation")
    log(f"task {task.name} (reward rules: {config.rules}), prompts: {config.style}, method {config.method}"
        + (f", AR alpha {config.alpha:g}" if config.alpha > 0 else "")
        + (f", Lopti eta {config.lopti_eta:g} ({config.lopti_order})" if config.lopti_eta > 0 else "")
        + f", lr {config.lr:g}, max new tokens {config.max_new_tokens}")
    model = memory_options(config, model.to(storage_dtype(config)))  # after the warm start: LoRA trains on the RL
    ref_model = None  # step only; --param-dtype bf16: the warm start and a resumed checkpoint load in fp32, then cast
    if config.kl_coef > 0 and config.lora_rank:  # the policy with its adapters off: no second copy of the weights
        ref_model = without_adapters(model)
    elif config.kl_coef > 0:
        try:
            ref_model = copy.deepcopy(model) if not config.resume else load_policy(  # loaded as the policy was:
                config.initial_policy, device=device)[0].to(storage_dtype(config))  # a bf16 load differs (RoPE)
        except ValueError as error:
            raise RunError(f"the reference (initial) policy for --kl-coef could not be loaded: {error}") from None
    if ref_model is not None:
        ref_model.eval().requires_grad_(False)
    return model, ref_model


def storage_dtype(config):
    """The torch dtype of the policy's (and the reference's) weights: --param-dtype."""
    return torch.bfloat16 if config.param_dtype in ("bf16", "bf16-sr") else torch.float32


def adamw_class(config):
    """torch.optim.AdamW, or for --optimizer adamw8bit torchao's AdamW8bit: the same update with each moment kept in
    8 bits per weight plus a float32 scale per block of 256 (optional: pip install torchao; torch.compile'd, so its
    first step compiles, minutes on a CPU). --param-dtype bf16: either one on fp32 master weights (MasterWeights).
    --param-dtype bf16-sr or --step-in-backward: LeanAdamW (harness/lean_optimizer.py), the same AdamW on the weights
    as they are stored (bf16: stochastically rounded, no masters), its moments fp32 or 8-bit (torchao's codes)."""
    if config.param_dtype == "bf16-sr" or config.step_in_backward:
        return finite_steps(functools.partial(LeanAdamW, moments="8bit" if config.optimizer == "adamw8bit" else
                                              "fp32", seed=config.seed, step_in_backward=config.step_in_backward))
    inner = optimizer_class(config)
    if config.optimizer_offload:  # every master and the moments in CPU memory (a CUDA run; hardware() checks)
        return finite_steps(functools.partial(MasterWeights, inner_class=inner, state_device="cpu"))
    return finite_steps(functools.partial(MasterWeights, inner_class=inner) if config.param_dtype == "bf16"
                        else inner)


def finite_steps(make_optimizer):
    """make_optimizer(params, **options) -> a function building the same optimizer, whose step() is not taken while
    a gradient holds a nan or inf (a nan or inf loss, an overflow): the weights and the optimizer's state stay as
    they were, and optimizer.skipped_steps counts it (RunState.log says so in one line and leaves it out of the
    row's optimizer_steps). --step-in-backward steps each weight inside backward, so step() finds no gradient to
    check; save_checkpoint still refuses a weight that is not finite."""
    def build(params, **options):
        params = list(params)
        optimizer = make_optimizer(params, **options)
        take_step = optimizer.step

        def step(*args, **kwargs):
            grads = [p.grad for p in params if p.grad is not None]
            if grads and not torch.stack([torch.isfinite(grad).all() for grad in grads]).all():
                optimizer.skipped_steps += 1
                return None
            return take_step(*args, **kwargs)
        optimizer.step, optimizer.skipped_steps = step, 0
        return optimizer
    return build


def fused_adamw(params, **options):
    """torch.optim.AdamW, fused (one kernel for every weight, no per-tensor launches) when all its weights are on
    CUDA; elsewhere (a CPU, --optimizer-offload's CPU masters) as torch builds it."""
    params = list(params)
    weights = [w for item in params for w in (item["params"] if isinstance(item, dict) else [item])]
    on_cuda = bool(weights) and all(w.is_cuda for w in weights)
    return torch.optim.AdamW(params, **options, **({"fused": True} if on_cuda else {}))


def optimizer_class(config):
    """adamw_class's optimizer for fp32 weights."""
    if config.optimizer == "adamw":
        return fused_adamw
    require_library("torchao", "--optimizer adamw8bit")
    from torchao.optim import AdamW8bit

    class AdamW8bitFloatLR(AdamW8bit):  # torchao wants lr as a tensor; the loop's warm-up sets a float
        def step(self, closure=None):
            rates = [group["lr"] for group in self.param_groups]
            for group in self.param_groups:
                group["lr"] = torch.as_tensor(group["lr"], dtype=torch.float32)
            try:
                return super().step(closure)
            finally:  # the metrics and the checkpoint read a plain float
                for group, rate in zip(self.param_groups, rates):
                    group["lr"] = float(rate)
    return AdamW8bitFloatLR


# lr: the loop's warm-up sets it before every step; fused, foreach: how (not what) the step computes
OPTIMIZER_SETTINGS_SET_EACH_STEP = {"lr", "fused", "foreach"}


def check_optimizer_settings(optimizer, saved, checkpoint_dir):
    """A RunError naming the setting when a checkpoint's optimizer param_groups say anything but what this run's
    settings built (weight decay, betas, eps, `maximize`, ...): load_state_dict would silently take the file's."""
    inner = saved.get("inner")  # MasterWeights (--param-dtype bf16): the inner optimizer's state holds the groups
    groups = (inner if isinstance(inner, dict) else saved).get("param_groups")
    if not isinstance(groups, list) or len(groups) != len(optimizer.param_groups) or \
            not all(isinstance(group, dict) for group in groups):
        raise RunError(f"{checkpoint_dir}/trainer_state.pt: its optimizer state does not fit this model (other "
                       "parameter groups); resume from another checkpoint")
    for ours, theirs in zip(optimizer.param_groups, groups):
        for key in sorted((set(ours) | set(theirs)) - {"params"} - OPTIMIZER_SETTINGS_SET_EACH_STEP):
            mine, other = ours.get(key, "absent"), theirs.get(key, "absent")
            if torch.is_tensor(mine) or torch.is_tensor(other):
                same = torch.is_tensor(mine) and torch.is_tensor(other) and torch.equal(mine, other)
            else:  # (0.9, 0.999) saved as a list is the same; True is not 1
                plain = lambda v: list(v) if isinstance(v, tuple) else v  # noqa: E731
                same = plain(mine) == plain(other) and isinstance(mine, bool) == isinstance(other, bool)
            if not same:
                raise RunError(f"{checkpoint_dir}/trainer_state.pt: its optimizer's {key} is {other!r}, but this "
                               f"run's settings (run.json) make it {mine!r}; resume from another checkpoint")


def check_master_weights(optimizer, model, saved, checkpoint_dir):
    """--param-dtype bf16 (MasterWeights): a RunError naming the weight when a checkpoint's master weight is not a
    finite tensor of its master's dtype (fp32) and its parameter's shape (load_state_dict would cast an int64 one
    to whole numbers, and a nan would reach the weights). A list of another length is load_state_dict's error."""
    if not isinstance(optimizer, MasterWeights):
        return
    pairs, masters = [(p, m) for p, m in zip(optimizer.params, optimizer.masters) if m is not p], saved.get("masters")
    if not isinstance(masters, list) or len(masters) != len(pairs):
        return
    names = {param: name for name, param in model.named_parameters()}
    for (param, master), value in zip(pairs, masters):
        problem = tensor_problem(value, master.dtype, master.shape)
        if problem:
            raise RunError(f"{checkpoint_dir}/trainer_state.pt: master weight {names[param]!r} {problem}; "
                           f"{instead_of(checkpoint_dir)}")


def memory_options(config, model):
    """The policy with --lora-rank's adapters (fresh, or the resumed checkpoint's) and --gradient-checkpointing."""
    if config.lora_rank:
        with policy_load_errors(config):
            model = load_adapters(model, config.resume, config) if config.resume else \
                add_lora(model, config.lora_rank, config.lora_alpha, config.lora_targets)
    if config.base_dtype == "nf4":  # after the adapters: only the frozen linears are quantized
        quantize_base(model)
    if config.gradient_checkpointing:
        enable_checkpointing(model)
    return model


# The bar: tqdm's own, without its seconds per step (progress_line has the step's own, the rollout and update)
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"
IDLE_EXIT = 3  # train.py's exit code after --idle-stop steps in a row that learned nothing (a checkpoint saved)


def progress_line(row):
    """The progress bar's live numbers from a step's metrics row: mean reward, pass rate, mean completion length
    (tokens), seconds per step; and, for a step that took no optimizer step, that it learned nothing."""
    return (f"reward {row['reward_mean']:.3f}, pass {row['pass_rate']:.2f}, length {row['response_length']:.0f}, "
            f"{row['rollout_s'] + row['update_s']:.2f} s/step"
            + ("" if row["optimizer_steps"] else ", nothing learned (rewards tied)"))


def sample_line(task, examples, prompts, k, completion, reward, width=48):
    """One printed eval sample on one line: its reward, prompt, completion and the expected answer (the task's
    compact solution, where it has one), each cut to `width` characters and quoted, so newlines stay escaped."""
    def cut(text):
        return repr(text if len(text) <= width else text[:width] + "...")
    prompt = f"{cut(prompts[k])} -> " if prompts and k < len(prompts) else ""
    expected = ""
    if hasattr(task, "solution") and examples and k < len(examples):
        try:
            expected = f"  (expected {cut(str(task.solution(examples[k], 'compact')))})"
        except ValueError:  # an example without a solution (countdown's solver found none)
            pass
    return f"    reward {reward:.3f}  {prompt}{cut(completion)}{expected}"


def idle_note(config, row, streak):
    """The one line printed after config.idle_warn steps in a row that learned nothing: what ties every group's
    rewards, and the flags that help."""
    if row["pass_rate"] >= 1:
        reason = "every completion passed (nothing left to learn: a harder --task-option)"
    else:
        reason = "in every group all completions scored the same" + (" (none passed)" if row["pass_rate"] == 0 else "")
    warm_start = " (the warm start reached pass@1 0? --warm-start-steps; or a task the tiny model cannot learn: " \
        "docs/tasks.md)" if config.model == "tiny" else ""
    stop = f"the run stops after {config.idle_stop} such steps (--idle-stop 0: go on)" if config.idle_stop else \
        "--idle-stop 0: the run goes on"
    return (f"note: {streak} steps in a row learned nothing: {reason}. Likely causes: a policy that never passes"
            f"{warm_start}; the sampling temperature (--temperature {config.temperature:g}; 0.3-0.7 for a chat "
            "model's short answers); a task reward that scores every completion alike. " + stop[0].upper() + stop[1:])


# ---------------------------------------------------------------------------------------------------------------
# The run's state: the folder, metrics, evals, checkpoints, Ctrl-C
# ---------------------------------------------------------------------------------------------------------------
def set_learning_rate(optimizer, config, step):
    """The step's learning rate: linear warm-up over --warmup-steps, then constant at --lr."""
    for group in optimizer.param_groups:
        group["lr"] = config.lr * min(1.0, step / (config.warmup_steps + 1))


@dataclasses.dataclass
class RunState:
    """What the loop reads and calls: step (the last finished step), initial_eval, begin(), log(), end_of_step(),
    final_eval(), clock (a phase timer for collect_rollouts / update_policy), stopped (0, or the number of the
    signal that stopped the run: Ctrl-C's SIGINT, or SIGTERM / SIGHUP from a scheduler, `docker stop`, a closed
    terminal)."""
    config: Config
    model: object = None
    tokenizer: object = None
    optimizer: object = None
    evaluate: object = None           # (samples list) -> {"pass@1", "reward", "length"}
    step: int = 0
    initial_eval: dict = None
    last_eval: tuple = (None, None)   # (step, result) of the newest eval
    stopped: int = 0
    phase_seconds: dict = dataclasses.field(default_factory=lambda: defaultdict(float))
    step_started: float = 0.0
    reporters: object = None          # --report-to's loggers (harness/report.py), open from begin() on
    eval_prompts: list = None         # the held-out prompts' texts, for the loggers' samples tables
    trained_steps: int = 0            # steps that took at least one optimizer step (over the whole run)
    idle_streak: int = 0              # the latest steps in a row that took none
    idle_stopped: bool = False        # stopped after --idle-stop such steps
    task: object = None               # the task and its held-out examples (begin)
    eval_examples: list = None
    watch: Watch = None               # the notes on whether the run learns (harness/watch.py)
    split_rows: int = None            # the task's held-out split's size (None: a generated split, any size)

    @property
    def exit_code(self):
        """train.py's exit code after the table: 128 + the signal's number after one, IDLE_EXIT after --idle-stop
        steps that learned nothing, else 0."""
        return 128 + self.stopped if self.stopped else IDLE_EXIT if self.idle_stopped else 0

    @property
    def metrics_path(self):
        return os.path.join(self.config.output_dir, "metrics.jsonl")

    def begin(self, model, tokenizer, optimizer, evaluate, task=None, eval_examples=()):
        """Fresh: the loggers opened (a W&B login or network failure is one line here, before any file), then
        metrics.jsonl begun with the held-out eval at step 0. Resumed: the optimizer, RNG states and step from the
        checkpoint; only then, and only when there is a step to train, are the metrics rows written after it dropped
        and `latest` pointed at it (a refused or empty resume changes nothing in the folder). task, eval_examples:
        the held-out examples, for the loggers' samples tables and the notes on learning (harness/watch.py)."""
        self.model, self.tokenizer, self.optimizer, self.evaluate = model, tokenizer, optimizer, evaluate
        self.task, self.eval_examples = task, list(eval_examples)
        self.eval_prompts = [report.prompt_text(task.prompt(example, self.config.style)) for example in eval_examples]
        self.watch = Watch(tiny=self.config.model == "tiny", warm_start=tiny.warm_start_seen(self.config),
                           advise=functools.partial(advice.flags_to_try, self.config))
        if self.eval_examples:  # an --eval-size above the split: said once, at start
            self.split_rows = advice.held_out_rows(task, self.config.eval_size, len(self.eval_examples))
            said = advice.eval_size_note(self.config, len(self.eval_examples))
            if said:
                say(said)
        model.train()
        torch.manual_seed(self.config.seed)  # the RL phase starts from the same RNG state whether or not warm start ran
        if self.config.lora_rank and not self.config.resume:  # the base its adapters belong to, in run.json
            self.config = dataclasses.replace(self.config,
                                              initial_policy_sha256=policy_digest(self.config.initial_policy))
        if self.config.resume:
            saved = load_trainer_state(self.config.resume)
            check_optimizer_settings(optimizer, saved["optimizer"], self.config.resume)
            check_master_weights(optimizer, model, saved["optimizer"], self.config.resume)
            try:
                optimizer.load_state_dict(saved["optimizer"])
                for param in model.parameters():  # load_state_dict checks counts, not shapes
                    for name, value in optimizer.state.get(param, {}).items():
                        if torch.is_tensor(value) and value.dim() and value.shape != param.shape:
                            raise ValueError(f"{name} {tuple(value.shape)} for a parameter {tuple(param.shape)}")
            except (ValueError, KeyError, RuntimeError, TypeError) as error:
                raise RunError(f"{self.config.resume}/trainer_state.pt: its optimizer state does not fit this model "
                               f"({type(error).__name__}); resume from another checkpoint") from None
            try:
                restore_rng(saved["rng"])
            except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as error:
                raise RunError(f"{self.config.resume}/trainer_state.pt: its RNG states are unusable "
                               f"({type(error).__name__}); resume from another checkpoint") from None
            verify_checkpoint(self.config.resume, say)  # its files as one set (config, tokenizer, ...): last, so
            # that a damaged file is named by the check that reads it first
            self.step, self.initial_eval = saved["step"], saved["initial_eval"]
            self.last_eval = (saved["step"], saved.get("last_eval"))
            # what can fail without changing the folder goes first: the loggers (a W&B run id it refuses, ...)
            self.reporters = report.open_reporters(self.config, self.step + 1)
            if self.step < self.config.steps:  # it goes on: from here on it replaces any later timeline
                rewrite_metrics(self.metrics_path, (row for row in metrics_rows(self.metrics_path, print)
                                                    if row["step"] <= self.step))  # rows after it: dropped
                later = later_checkpoints(self.config.output_dir, self.step)
                if later:  # `latest` names the timeline going on, so no save ever replaces what it points to
                    point_latest(self.config.output_dir, self.step)
                    say(f"note: resuming from checkpoint-{self.step}: the later {', '.join(later)} of this run "
                        "will be replaced from this run's first checkpoint on")
            kept = [row for row in metrics_rows(self.metrics_path, print) if row["step"] <= self.step]
            self.count_trained(row for row in kept if not row.get("eval"))
            self.watch.first = self.initial_eval  # the notes go on from the rows so far, silently
            for row in kept:
                if row.get("eval") and row["step"] > 0 and self.initial_eval:
                    self.watch.later_eval(row["step"], row, [])
                elif not row.get("eval"):
                    self.watch.train_row(row)
            print(f"resumed from step {self.step} ({self.config.resume})"
                  + ("" if self.step < self.config.steps else f"; --steps {self.config.steps} is reached: nothing "
                     "to train (raise --steps to go on)"), flush=True)
        else:  # the loggers first; metrics.jsonl is then created by the step-0 eval's row below
            self.reporters = report.open_reporters(self.config, 0)
            self.initial_eval = self.eval_now(0)
        self.step_started = time.time()

    @contextlib.contextmanager
    def clock(self, name):
        start = time.time()
        try:
            yield
        finally:
            self.phase_seconds[name] += time.time() - start

    def log(self, row, *, tokens):
        """Append one step's metrics (plus its timings) to metrics.jsonl. -> the row written."""
        elapsed = time.time() - self.step_started
        rollout = self.phase_seconds["rollout"] + self.phase_seconds["reward+advantage"]
        skipped, self.optimizer.skipped_steps = getattr(self.optimizer, "skipped_steps", 0), 0  # finite_steps
        if skipped:
            row = {**row, "optimizer_steps": row["optimizer_steps"] - skipped, "skipped_steps": skipped}
            say(f"step {row['step']}: {skipped} optimizer step(s) not taken: a gradient held nan or inf (the loss's "
                "too, or an overflow); the weights and the optimizer's state are as before them")
        row = {**row, "rollout_s": rollout, "update_s": elapsed - rollout, "tokens_per_s": tokens / max(elapsed, 1e-9)}
        append_metrics(self.metrics_path, row)
        self.reporters.row(row)
        self.phase_seconds.clear()
        self.count_trained([row])
        self.watch.train_row(row)
        if self.idle_streak == self.config.idle_warn:
            say(idle_note(self.config, row, self.idle_streak))
        return row

    def count_trained(self, rows):
        """trained_steps and idle_streak after these train rows (a resumed run: its rows up to the checkpoint)."""
        for row in rows:
            trained = row.get("optimizer_steps", 1) > 0  # a row without the count: taken as trained
            self.trained_steps += trained
            self.idle_streak = 0 if trained else self.idle_streak + 1

    def trained_line(self):
        """The end-of-run table's line: how many steps trained."""
        final = self.last_eval[1] if self.last_eval[0] == self.step and self.step > 0 else None
        evals = [(step, result) for step, result in (self.watch.evals_seen if self.watch else []) if step < self.step]
        noise_said, moved = advice.end_lines(self.config, self.initial_eval, evals + [(self.step, final)],
                                             self.watch.reward_rows if self.watch else [],
                                             len(self.eval_examples or ()), self.split_rows) \
            if self.initial_eval and final else ([], None)
        verdict = self.watch.verdict(moved) if self.watch else None
        trained = f"steps that trained (took an optimizer step): {self.trained_steps} of {self.step}"
        return "\n".join(filter(None, [*noise_said, trained, verdict]))

    def eval_now(self, step, shown=SAMPLES_SHOWN):
        """The held-out eval, logged as an eval row; prints its numbers and the first `shown` greedy completions."""
        samples = []
        self.last_eval = (step, self.evaluate(samples))
        append_metrics(self.metrics_path, {"step": step, "eval": True, **self.last_eval[1]})
        self.reporters.row({"step": step, "eval": True, **self.last_eval[1]})
        self.reporters.samples(step, samples, self.eval_prompts)
        result = self.last_eval[1]
        say(f"step {step}: held-out pass@1 {result['pass@1']:.3f}  reward {result['reward']:.3f}")
        for k, (completion, reward) in enumerate(samples[:shown]):
            say(sample_line(self.task, self.eval_examples, self.eval_prompts, k, completion, reward))
        notes = [self.watch.start(result, samples, self.constant_pass(samples))] if step == 0 else \
            self.watch.later_eval(step, result, samples)
        for note in filter(None, notes):
            say(note)
        return result

    def constant_pass(self, samples):
        """The held-out pass@1 of answering the most common greedy completion to every prompt (None without the
        task's examples, under MIN_PROMPTS prompts, or when that answer is rarer than CONSTANT_CHECKED: the reward is
        then not called)."""
        answer, share = top_answer(samples)  # scored only where one answer is common enough to matter
        if len(samples) < MIN_PROMPTS or share < CONSTANT_CHECKED or self.task is None \
                or len(self.eval_examples) != len(samples):
            return None
        return sum(float(self.task.reward(answer, example, style=self.config.style)) >= self.task.pass_threshold
                   for example in self.eval_examples) / len(self.eval_examples)

    def page_before_update(self, step, rollouts, rewards):
        """--inspect-every's hook before the update: the step's page record (harness/step_page.py), p_old fixed from
        the weights before it; None on a step the flag does not ask for."""
        from harness.step_page import before_update  # the page's code loads only when a page is made
        return before_update(self.config, step, self.model, self.tokenizer, self.task, rollouts, rewards)

    def page_after_update(self, record, stats):
        """--inspect-every's hook after the update: the page written, and its path said."""
        if record is not None:
            from harness.step_page import after_update
            say(f"step {record.step}: its page is {after_update(record, self.model, stats)}")

    def end_of_step(self, step):
        """The held-out eval and the checkpoint when due (every eval_every / save_every steps, the last step, and
        a checkpoint after Ctrl-C or after --idle-stop steps in a row that learned nothing). -> True when the loop
        should stop (then exit_code says why)."""
        self.step = step
        self.idle_stopped = 0 < self.config.idle_stop <= self.idle_streak and step < self.config.steps
        if step % self.config.eval_every == 0 or step == self.config.steps or self.idle_stopped:
            self.eval_now(step)
        if step % self.config.save_every == 0 or step == self.config.steps or self.stopped or self.idle_stopped:
            self.save(step)
        if self.stopped:
            say(f"stopped at step {step}; continue with {advice.resume_command(self.config)}")
        elif self.idle_stopped:
            say(f"stopped at step {step}: {self.idle_streak} steps in a row learned nothing (the note above says "
                f"why); checkpoint-{step} is saved: {advice.resume_command(self.config, '--idle-stop', 0)} goes on "
                "anyway")
        self.step_started = time.time()
        return self.stopped or self.idle_stopped

    def save(self, step):
        trainer_state = {"step": step, "initial_eval": self.initial_eval,
                         "last_eval": self.last_eval[1] if self.last_eval[0] == step else None,
                         "optimizer": self.optimizer.state_dict(), "rng": rng_state()}
        save_checkpoint(self.config.output_dir, step, self.model, self.tokenizer, trainer_state,
                        self.config.saved(), keep=self.config.keep_checkpoints, log=say)

    def final_eval(self):
        """The eval of the final weights: the one at the last step if there was one, else a new one."""
        if self.last_eval[0] != self.step or self.last_eval[1] is None:
            self.last_eval = (self.step, self.evaluate([]))  # kept: the end table's noise line reads it
        return self.last_eval[1]


UNSAVED_METRICS = "unsaved-metrics.jsonl"  # where set_aside_unsaved_metrics keeps such a run's rows


def set_aside_unsaved_metrics(output_dir):
    """A fresh start in a folder whose only run file is metrics.jsonl (a run that stopped before its first
    checkpoint: an error, a kill; an empty one from before the W&B check moved ahead of it): nothing there can be
    resumed, so nothing claims the folder. The file is renamed to UNSAVED_METRICS, with a note, and the run starts."""
    if holds_a_run(output_dir) != ["metrics.jsonl"]:
        return
    path = os.path.join(output_dir, "metrics.jsonl")
    try:
        os.replace(path, os.path.join(output_dir, UNSAVED_METRICS))
    except OSError as error:
        raise RunError(write_failed(path, error)) from None
    say(f"note: {path} was from a run that stopped before its first checkpoint (nothing to resume); kept as "
        f"{UNSAVED_METRICS}, starting afresh")


def resumed_step(config):
    """The step a run starts after: a resumed checkpoint's (config.load names it checkpoint-<step>), else 0. begin()
    confirms it from trainer_state.pt; until then a message about the run names the right step."""
    if not config.resume:
        return 0
    folder = os.path.normpath(config.resume)
    return checkpoint_step(os.path.dirname(folder), os.path.basename(folder)) or 0


@contextlib.contextmanager
def start(config):
    """Own the output folder for the block: a lock (one run per folder), what a kill left put right, and either a
    fresh start (refused where a run already is, unless --overwrite) or a resumed one (the checkpoints after the one
    resumed are discarded, with a note). Yields the RunState; call its begin() once the policy is built. Ctrl-C,
    SIGTERM or SIGHUP inside: the step finishes, a checkpoint is saved, the loop stops (train.py then exits with
    128 + the signal's number, as the shell reports a process the signal ended); a second signal aborts at once."""
    try:
        os.makedirs(config.output_dir, exist_ok=True)
    except OSError as error:
        raise RunError(f"cannot create --output-dir {config.output_dir}: {error.strerror or error}") from None
    with locked(config.output_dir):
        refuse_planted_links(config.output_dir)  # before anything is put right, set aside or deleted
        recover(config.output_dir)
        if not config.resume:
            set_aside_unsaved_metrics(config.output_dir)
        if not config.resume and holds_a_run(config.output_dir):
            if not config.overwrite:
                raise RunError(f"{config.output_dir} holds a run ({', '.join(holds_a_run(config.output_dir)[:3])}); "
                               f"continue it with {advice.resume_command(config)}, pick another --output-dir, or pass "
                               "--overwrite to delete it")
            remove_run(config.output_dir)
        state = RunState(config, step=resumed_step(config))

        def on_stop_signal(signum, frame):
            if state.stopped and signum == signal.SIGINT:
                raise KeyboardInterrupt
            if state.stopped:  # a second SIGTERM / SIGHUP: die of it now (the kernel releases the lock)
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
            state.stopped = signum
            name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
            TimedRewards.stop(signum)  # a reward that never returns still ends the run (STOP_GRACE)
            if state.model is None:  # loading or warm-starting the policy: nothing to save yet, stop now
                say(f"\n{name}: stopped before the first step; nothing was saved (the warm start is cached only "
                    "once it ends)")
                raise Stopped(signum)
            say(f"\n{name}: saving a checkpoint after this step ({'press' if name == 'Ctrl-C' else 'send'} "
                "again to abort)")
        previous = {signum: signal.signal(signum, on_stop_signal) for signum in STOP_SIGNALS}
        TimedRewards.stop_signal = 0
        try:
            yield state
        except Stopped:
            saved = checkpoint_steps(config.output_dir)
            if state.model is not None and saved:
                say(f"{advice.resume_command(config)} continues from checkpoint-{saved[-1]}")
            raise
        except (RunError, InputError, KeyboardInterrupt):
            raise
        except RewardTimeout as error:
            raise InputError(str(error)) from None
        except tasks.TaskError as error:  # a task file's reward returned no number: one line, like before the loop
            raise InputError(str(error)) from None
        except Exception:  # a bug in the code: its traceback follows this line, the folder is unlocked
            saved = checkpoint_steps(config.output_dir)
            where = f"in step {state.step + 1}" if state.model is not None else f"before step {state.step + 1}"
            print(f"\nthe run stopped {where} on the error below; its files are intact"
                  + (f": {advice.resume_command(config)} continues from checkpoint-{saved[-1]}" if saved else
                     ", with no checkpoint: the same command starts afresh"), file=sys.stderr, flush=True)
            raise
        finally:
            TimedRewards.stop_signal = 0
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if state.reporters is not None:
                state.reporters.close()
