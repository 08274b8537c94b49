"""A training run's lifecycle, beside train.py's loop: the folder owned, metrics, evals, checkpoints, Ctrl-C.

    with start(config) as state:                            # the folder locked; fresh (never over a run) or resumed
        state.begin(model, tokenizer, optimizer, evaluate)  # fresh: eval at step 0; resumed: state restored
        for step in range(state.step + 1, config.steps + 1):
            ...                                             # the RL step (train.py), then state.log(row, tokens=...)
            if state.end_of_step(step):                     # eval and checkpoint when due; True after Ctrl-C
                break

Problems a user can act on are one line: a RunError (the run's files: exit 1) or an InputError (a
flag, the model, the task or its data: exit 2), all raised before the first step except the disk's.
"""
import contextlib
import dataclasses
import functools
import os
import signal
import sys
import time
from collections import defaultdict

import torch

import tasks
from harness import advice, report, tiny
from harness.checkpoint import (checkpoint_step, checkpoint_steps, holds_a_run, later_checkpoints, locked, point_latest,
                                recover, refuse_planted_links, remove_run, rng_state, save_checkpoint)
from harness.config import Config, InputError
from harness.console import SAMPLES_SHOWN, sample_line, say
from harness.files import RunError, write_failed
from harness.memory import EVAL_BATCH
from harness.metrics import append_metrics, metrics_rows, rewrite_metrics
from harness.model import policy_digest
from harness.policy import restore_trainer_state
from harness.reward_worker import RewardTimeout, TimedRewards
from harness.stops import Stopped
from harness.stops import IDLE_EXIT, STOP_SIGNALS, idle_note
from harness.watch import CONSTANT_CHECKED, MIN_PROMPTS, Watch, top_answer

TIMING_KEYS = ("rollout_s", "update_s", "tokens_per_s")  # the only metrics that differ between identical runs


# ---------------------------------------------------------------------------------------------------------------
# The run's state: the folder, metrics, evals, checkpoints, Ctrl-C
# ---------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class RunState:
    """What the loop reads and calls: step (the last finished step), initial_eval, begin(), log(), end_of_step(),
    final_eval(), clock (a phase timer), stopped (0, or the number of the signal that stopped the
    run)."""
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
    saved_at: float = 0.0             # time.time() of the last save (or begin): for --save-minutes
    phase: str = None                 # the clock's phase now ("eval": the held-out eval)

    @property
    def exit_code(self):
        """train.py's exit code after the table: 128 + the signal's number after one, IDLE_EXIT after --idle-stop
        steps that learned nothing, else 0."""
        return 128 + self.stopped if self.stopped else IDLE_EXIT if self.idle_stopped else 0

    @property
    def metrics_path(self):
        return os.path.join(self.config.output_dir, "metrics.jsonl")

    def begin(self, model, tokenizer, optimizer, evaluate, task=None, eval_examples=()):
        """Fresh: the loggers opened, then metrics.jsonl begun with the held-out eval at step 0.
        Resumed: the optimizer, RNG states and step from the checkpoint; only when there is a step
        to train are later metrics rows dropped and `latest` pointed at it (a refused or empty
        resume changes nothing)."""
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
            saved = restore_trainer_state(self.config.resume, model, optimizer)
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
        self.step_started = self.saved_at = time.time()

    @contextlib.contextmanager
    def clock(self, name):
        start, self.phase = time.time(), name
        try:
            yield
        finally:
            self.phase_seconds[name] += time.time() - start
        self.phase = None  # not after an error: the out-of-memory line names the phase

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
        samples, self.phase = [], "eval"
        self.last_eval, self.phase = (step, self.evaluate(samples)), None  # an error leaves "eval"
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
        """The held-out eval and the checkpoint when due (every eval_every / save_every steps, the
        last step, save_minutes after the last save, and after Ctrl-C or after --idle-stop steps in
        a row that learned nothing). -> True when the loop should stop (then exit_code says why)."""
        self.step = step
        self.idle_stopped = 0 < self.config.idle_stop <= self.idle_streak and step < self.config.steps
        if step % self.config.eval_every == 0 or step == self.config.steps or self.idle_stopped:
            self.eval_now(step)
        late = time.time() - self.saved_at >= 60 * (self.config.save_minutes or 0) > 0
        if step % self.config.save_every == 0 or step == self.config.steps or late or self.stopped \
                or self.idle_stopped:
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
        self.saved_at = time.time()

    def final_eval(self):
        """The eval of the final weights: the one at the last step if there was one, else a new one."""
        if self.last_eval[0] != self.step or self.last_eval[1] is None:
            self.last_eval = (self.step, self.evaluate([]))  # kept: the end table's noise line reads it
        return self.last_eval[1]


def out_of_memory(state, saved):
    """The line a CUDA out-of-memory error becomes: the setting to lower where it struck (a
    generate call's rows in the rollout and the eval, else the micro-batch) and the command on."""
    config, M, phase = state.config, state.config.num_generations, state.phase
    rows = min(config.rollout_batch or EVAL_BATCH, config.eval_size) if phase == "eval" else \
        min(config.rollout_batch or M * config.prompts_per_step, M * config.prompts_per_step)
    flag, now = ("--rollout-batch", rows) if phase in ("rollout", "eval") else \
        ("--micro-batch", config.micro_batch)
    lower = max(M, now // 2 // M * M) if flag == "--rollout-batch" else max(1, now // 2)
    where = f"the held-out eval after step {state.step}" if phase == "eval" else \
        f"step {state.step + 1}'s {phase or 'update'}"
    fit = "--dry-run --memory-budget <the card's memory> prints settings that fit"
    if state.model is None:
        return f"{config.device} ran out of memory building the policy: " + fit
    if lower == now:
        return f"{config.device} ran out of memory in {where} at {flag} {now}, the least: " + fit
    go_on = f"{advice.resume_command(config, flag, lower)} continues from checkpoint-{saved[-1]}" \
        if saved else f"no checkpoint yet: the same command with {flag} {lower} starts afresh"
    return f"{config.device} ran out of memory in {where} at {flag} {now}: lower it; {go_on}"


UNSAVED_METRICS = "unsaved-metrics.jsonl"  # where set_aside_unsaved_metrics keeps such a run's rows


def set_aside_unsaved_metrics(output_dir):
    """A fresh start in a folder whose only run file is metrics.jsonl (a run stopped before its
    first checkpoint): nothing can be resumed, so the file is renamed to UNSAVED_METRICS, with a
    note, and the run starts."""
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
    """The step a run starts after: a resumed checkpoint's (flags.load names it checkpoint-<step>), else 0. begin()
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
    SIGTERM or SIGHUP: the step finishes, a checkpoint is saved, the run exits 128 + N; a second
    signal aborts."""
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
        except (RewardTimeout, tasks.TaskError) as error:  # a reward that hung or returned no number: one line
            raise InputError(str(error)) from None
        except torch.OutOfMemoryError:  # one line: the setting to lower, how to go on
            raise RunError(out_of_memory(state, checkpoint_steps(config.output_dir))) from None
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
