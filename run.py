"""A training run's lifecycle, beside train.py's loop: settings, the policy, metrics, evals, checkpoints, Ctrl-C.

    config = resolve(config)                                # --resume: the saved run's settings
    model, tokenizer, task, ref_model = build_policy(config)
    with start(config, model, tokenizer, optimizer, evaluate) as state:  # fresh: eval 0; resumed: state restored
        for step in range(state.step + 1, config.steps + 1):
            ...                                             # the RL step (train.py)
            state.log(row)                                  # one row of metrics.jsonl
            if state.end_of_step(step):                     # eval and checkpoint when due; True after Ctrl-C
                break

Every file is written atomically (checkpoint.py), so a kill, a full disk or a read-only folder never loses what was
there; problems a user can act on are a RunError: one line naming the file and what to do. A reader of the RL
algorithm can skip this file.
"""
import contextlib
import copy
import dataclasses
import json
import os
import random
import signal
import time
from collections import defaultdict

import numpy as np
import torch
import transformers

import tasks
import tiny
from checkpoint import (RunError, append_metrics, load_run_settings, load_trainer_state, read_metrics,
                        resolve_checkpoint, restore_rng, rewrite_metrics, rng_state, save_checkpoint)
from config import Config, flag_name, resumable
from model import load_policy

TIMING_KEYS = ("rollout_s", "update_s", "tokens_per_s")  # the only metrics that differ between identical runs


# ---------------------------------------------------------------------------------------------------------------
# Settings: fresh or resumed; device and dtype
# ---------------------------------------------------------------------------------------------------------------
def resolve(config):
    """A copy of config, ready to run: --resume replaced by the saved run's settings (plus the flags a resumed run
    may change: config.resumable()), --device/--dtype auto chosen for this machine."""
    config = resumed_settings(config) if config.resume else dataclasses.replace(config)
    config.device = config.device if config.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    config.dtype = config.dtype if config.dtype != "auto" else "bf16" if config.device.startswith("cuda") else "fp32"
    return config


def resumed_settings(config):
    """The saved run's settings; a flag given now must be one a resumed run may change, or equal the saved value
    (else a RunError). The run continues in the checkpoint's own folder."""
    if not os.path.exists(config.resume):
        raise ValueError(f"--resume {config.resume}: no such folder")
    checkpoint_dir = resolve_checkpoint(config.resume)
    saved = load_run_settings(checkpoint_dir)
    path = os.path.join(checkpoint_dir, "run.json")
    keys = {f.name for f in dataclasses.fields(Config) if f.metadata.get("saved", True)}
    if not isinstance(saved, dict) or set(saved) != keys:
        wrong = "not a JSON object" if not isinstance(saved, dict) else \
            f"missing {sorted(keys - set(saved))}, unknown {sorted(set(saved) - keys)}"
        raise RunError(f"{path}: not this train.py's settings ({wrong}); resume from another checkpoint")
    run_dir = os.path.dirname(checkpoint_dir)
    normal = lambda value: json.loads(json.dumps(value))  # noqa: E731  (tuples -> lists, as saved)
    if "output_dir" in config.given and os.path.realpath(config.output_dir) != run_dir:
        raise RunError(f"--output-dir {config.output_dir} conflicts with the run being resumed, which lives in "
                       f"{run_dir}; drop the flag")
    changes = {}
    for key in sorted(config.given - {"resume", "dry_run", "output_dir"}):
        value = {**saved["task_options"], **config.task_options} if key == "task_options" else getattr(config, key)
        if key in resumable():
            changes[key] = value
        elif normal(value) != saved[key]:
            raise RunError(f"{flag_name(key)} {getattr(config, key)} conflicts with the run being resumed "
                           f"({saved[key]!r}); drop the flag, or start a new run with another --output-dir")
    try:
        return Config(**{**saved, **changes, "resume": checkpoint_dir, "output_dir": run_dir,
                         "dry_run": config.dry_run, "given": config.given}).validate()
    except (TypeError, ValueError) as error:
        raise RunError(f"{path}: {error}; resume from another checkpoint") from None


def print_settings(config):
    """--dry-run: the resolved settings as JSON, without loading the model (a model other than "tiny" is taken to
    be a chat model). -> the settings dict."""
    if not config.resume and config.model == "tiny":
        config.style = "compact"
        tiny.apply_cpu_defaults(config)
    print(json.dumps(config.saved(), indent=1, sort_keys=True))
    return config.saved()


# ---------------------------------------------------------------------------------------------------------------
# The policy, its task, the reference policy
# ---------------------------------------------------------------------------------------------------------------
def build_policy(config, *, log=print):
    """Seed everything, load the policy (fresh: the tiny model's CPU defaults and warm start, tiny.py), build the
    task and, when kl_coef > 0, the frozen reference policy. Fills in config.style, rules, initial_policy.
    -> (model, tokenizer, task, ref_model or None)."""
    transformers.utils.logging.disable_progress_bar()  # the loop's tqdm bar is the only one
    torch.manual_seed(config.seed)
    random.seed(config.seed)
    np.random.seed(config.seed)
    device = torch.device(config.device)
    model, tokenizer = load_policy(config.resume or config.model, device=device, tiny_hidden=config.tiny_hidden,
                                   tiny_layers=config.tiny_layers, seed=config.seed)
    if not config.resume:
        config.style = tiny.prompt_style(tokenizer)
        if config.style == "compact":  # the defaults hook: a CPU-sized character model (tiny.CPU_DEFAULTS)
            tiny.apply_cpu_defaults(config)
    if config.threads:
        torch.set_num_threads(config.threads)
    task = tasks.get_task(config.task, data=config.data, **config.task_options)
    if not config.resume:
        config.initial_policy = os.path.abspath(config.model) if os.path.exists(config.model) else config.model
        if config.model == "tiny":
            model, folder = tiny.prepare(config, model, tokenizer, task, log=log)
            config.initial_policy = os.path.abspath(folder)
        elif config.style == "chat" and not getattr(tokenizer, "chat_template", None):
            log(f"note: {config.model} has no chat template; prompts are a plain-text User/Assistant conversation")
    config.rules = getattr(task, "rules", None) if config.style == "chat" else "compact"
    log(f"task {task.name} (reward rules: {config.rules}), prompts: {config.style}, method {config.method}, "
        f"lr {config.lr:g}, max new tokens {config.max_new_tokens}")
    ref_model = None
    if config.kl_coef > 0:
        try:
            ref_model = copy.deepcopy(model) if not config.resume else load_policy(config.initial_policy,
                                                                                   device=device)[0]
        except ValueError as error:
            raise RunError(f"the reference (initial) policy for --kl-coef could not be loaded: {error}") from None
        ref_model.eval().requires_grad_(False)
    return model, tokenizer, task, ref_model


# ---------------------------------------------------------------------------------------------------------------
# The run's state: metrics, evals, checkpoints, Ctrl-C
# ---------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class RunState:
    """What the loop reads and calls: step (the last finished step), initial_eval, log(), end_of_step(),
    final_eval(), clock (a phase timer for collect_rollouts / update_policy)."""
    config: Config
    model: object
    tokenizer: object
    optimizer: object
    evaluate: object                  # () -> {"pass@1", "reward", "length"}
    step: int = 0
    initial_eval: dict = None
    last_eval: tuple = (None, None)   # (step, result) of the newest eval
    stopped: bool = False             # Ctrl-C was pressed
    phase_seconds: dict = dataclasses.field(default_factory=lambda: defaultdict(float))
    step_started: float = 0.0

    @property
    def metrics_path(self):
        return os.path.join(self.config.output_dir, "metrics.jsonl")

    @contextlib.contextmanager
    def clock(self, name):
        start = time.time()
        try:
            yield
        finally:
            self.phase_seconds[name] += time.time() - start

    def log(self, row, *, tokens):
        """Append one step's metrics (plus its timings) to metrics.jsonl."""
        elapsed = time.time() - self.step_started
        rollout = self.phase_seconds["rollout"] + self.phase_seconds["reward+advantage"]
        append_metrics(self.metrics_path, {**row, "rollout_s": rollout, "update_s": elapsed - rollout,
                                           "tokens_per_s": tokens / max(elapsed, 1e-9)})
        self.phase_seconds.clear()

    def eval_now(self, step):
        self.last_eval = (step, self.evaluate())
        append_metrics(self.metrics_path, {"step": step, "eval": True, **self.last_eval[1]})
        return self.last_eval[1]

    def end_of_step(self, step):
        """The held-out eval and the checkpoint when due (every eval_every / save_every steps, the last step, and
        a checkpoint after Ctrl-C). -> True when the loop should stop (Ctrl-C)."""
        self.step = step
        if step % self.config.eval_every == 0 or step == self.config.steps:
            result = self.eval_now(step)
            print(f"step {step}: held-out pass@1 {result['pass@1']:.3f}  reward {result['reward']:.3f}", flush=True)
        if step % self.config.save_every == 0 or step == self.config.steps or self.stopped:
            self.save(step)
        if self.stopped:
            print(f"stopped at step {step}; continue with --resume {self.config.output_dir}", flush=True)
        self.step_started = time.time()
        return self.stopped

    def save(self, step):
        trainer_state = {"step": step, "initial_eval": self.initial_eval,
                         "last_eval": self.last_eval[1] if self.last_eval[0] == step else None,
                         "optimizer": self.optimizer.state_dict(), "rng": rng_state()}
        save_checkpoint(self.config.output_dir, step, self.model, self.tokenizer, trainer_state,
                        self.config.saved(), keep=self.config.keep_checkpoints)

    def final_eval(self):
        """The eval of the final weights: the one at the last step if there was one, else a new one."""
        return self.last_eval[1] if self.last_eval[0] == self.step and self.last_eval[1] is not None \
            else self.evaluate()


@contextlib.contextmanager
def start(config, model, tokenizer, optimizer, evaluate):
    """Start the run fresh (metrics.jsonl begun, held-out eval at step 0) or resumed (optimizer, RNG states and
    step from the checkpoint; metrics rows written after it dropped). Yields the RunState. Ctrl-C inside: the step
    finishes, a checkpoint is saved, and the process exits with 130 after the block; a second Ctrl-C aborts."""
    os.makedirs(config.output_dir, exist_ok=True)
    state = RunState(config, model, tokenizer, optimizer, evaluate)
    model.train()
    torch.manual_seed(config.seed)  # the RL phase starts from the same RNG state whether or not warm start ran
    if config.resume:
        saved = load_trainer_state(config.resume)
        optimizer.load_state_dict(saved["optimizer"])
        restore_rng(saved["rng"])
        state.step, state.initial_eval = saved["step"], saved["initial_eval"]
        state.last_eval = (saved["step"], saved.get("last_eval"))
        rewrite_metrics(state.metrics_path, [row for row in read_metrics(state.metrics_path, print)
                                             if row["step"] <= state.step])  # drop rows written after the checkpoint
    else:
        rewrite_metrics(state.metrics_path, [])
        state.initial_eval = state.eval_now(0)

    def on_ctrl_c(signum, frame):
        if state.stopped:
            raise KeyboardInterrupt
        state.stopped = True
        print("\nCtrl-C: saving a checkpoint after this step (press again to abort)", flush=True)
    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    state.step_started = time.time()
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, previous)
