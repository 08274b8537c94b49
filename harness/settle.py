"""Settling a run: every setting decided once, before anything loads, then frozen.

    config, tokenizer, task, prompts = settle(config)   # --device/--dtype auto, the prompt style, the task's rules
    print_settings(config)                              # --dry-run: the settled settings and the memory plan

Decided here for this machine (hardware), for the task file (task_file), and checked against the memory plan
(--memory-budget refuses, else a note when the plan is larger than the machine). Problems with the user's input are
one InputError line (exit 2), raised before the first step.
"""
import contextlib
import dataclasses
import json
import os
import signal
import sys
import uuid

import torch

import tasks
from harness import memory, tiny
from harness.advice import eval_size_note
from harness.checkpoint import RUN_SETTINGS, existing_copy, instead_of
from harness.config import InputError
from harness.console import say
from harness.files import RunError, what_is
from harness.flags import check_libraries, fixed_paths
from harness.manifest import file_sha256, verify_manifest
from harness.model import base_changed, load_tokenizer
from harness.policy import policy_load_errors
from harness.prompts import epoch_steps, training_prompts
from harness.reward_worker import RewardTimeout, worker_first
from harness.stops import Stopped


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
    except KeyboardInterrupt:  # Ctrl-C while a task file or the model loads: one line, no traceback
        say("\nCtrl-C: stopped before the first step; nothing was saved")
        raise Stopped(signal.SIGINT) from None


def settle(config):
    """Every setting the run needs, decided once and frozen -> (config, tokenizer, task, prompts(step)).

    Decided here: --device/--dtype auto; for a fresh run, the prompt style from the tokenizer
    (compact for the tiny vocabulary, with tiny.CPU_DEFAULTS), the task's reward rules, where the
    initial weights live; --epochs' step count. --dry-run loads nothing: (config, None, None, None).
    The run's folders are absolute from here on."""
    config = hardware(fixed_paths(config, ("output_dir", "warm_start_cache", "resume")))
    if config.resume:  # run.json as its save wrote it, before anything it names is opened
        verify_manifest(config.resume, instead_of(config.resume), names=[RUN_SETTINGS])
    run_folders(config)
    changed = base_changed(config, f"{config.resume}/{RUN_SETTINGS}") if config.resume else None
    if changed:  # a resumed LoRA run loads its base from initial_policy: the one its adapters trained on
        raise RunError(changed)
    if not config.dry_run:
        check_libraries(config)  # a Config from Python; the command line's flags.load checked it before torch
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
        timed = worker_first(config)  # harness/reward_worker.py: a task file is built in its worker first
        if config.dry_run:  # --data is read where it exists here (a plan for another machine may name its path)
            steps = epoch_steps(config, config.train_size // config.prompts_per_step) if config.epochs and \
                config.train_size else config.steps  # the steps --epochs sets from --train-size
            built = tasks.is_task_file(config.task) or \
                (os.path.exists(config.data) if config.data else config.task not in tasks.NEEDS_DATA)
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
    if config.dry_run and task is not None and (config.data or config.task not in tasks.TASKS):  # its split: rows
        held_out = len(task.examples("test", config.eval_size, seed=config.seed))  # what the run's evals draw
        if held_out < config.eval_size:
            print(eval_size_note(config, held_out), file=sys.stderr)  # beside the plan: stdout holds the JSON
            changes["eval_size"] = held_out
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
    with --task again (flags.named_task); when that file is not the one the run started with, a note says so."""
    if not tasks.is_task_file(config.task):
        return config
    digest = file_sha256(tasks.custom.source_file(config.task))
    if config.resume and digest != config.task_file_sha256:
        say(f"note: {config.task} is not the file this run started with (sha256 {str(config.task_file_sha256)[:12]}"
            f"..., now {digest[:12]}...); resuming with it, as --task asks")
    return dataclasses.replace(config, task_file_sha256=digest)


SAVE_MINUTES = 30.0  # --save-minutes on CUDA: a crash costs at most this much of an evening


def hardware(config):
    """A copy of config with --device and --dtype "auto" decided: bf16 on a CUDA card with bf16 or
    under --param-dtype bf16, else fp32 (a T4 or V100: fp32, not fp16 with a loss scaler; a note
    says so). A dry run for a device this machine lacks plans for a bf16 card."""
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
    minutes = config.save_minutes if config.save_minutes is not None else SAVE_MINUTES * cuda
    return dataclasses.replace(config, device=device, dtype=dtype, save_minutes=minutes)


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
    proposed = memory.step_time_text(shape, dataclasses.replace(config, **fit[0]), prompt_length,
                                     "with the settings that fit", False) \
        if gpu and fit and fit[0] else ""
    print(memory.plan_text(plan, budget, fit) + (f"\n{memory.modes_text(modes, budget)}" if modes else "")
          + (f"\n{memory.step_time_text(shape, config, prompt_length)}{memory.never_on_gpu(vars(config))}"
             if gpu else "")
          + (f"\n{proposed}" if proposed else "")
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
    over_host(plan)


def over_host(plan):
    """--optimizer-offload's states (the plan's "offloaded") over this machine's RAM with the plan's
    headroom: one note before the first step, as the card's (over_machine)."""
    host, needs = machine_memory("cpu"), plan["offloaded"] * (1 + memory.PLAN_ERROR) / memory.GB
    if plan["offloaded"] and host and needs * memory.GB > host[0]:
        say(f"note: --optimizer-offload keeps {plan['offloaded'] / memory.GB:.1f} GB of fp32 "
            f"masters and AdamW's moments in CPU memory ({needs:.1f} with the plan's headroom), "
            f"more than {host[1]}, {host[0] / memory.GB:.0f}GB: it may run out of memory "
            "(--optimizer adamw8bit or a smaller model)")


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
    over_host(plan)
