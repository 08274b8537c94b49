"""What stops a run: a signal (Ctrl-C, SIGTERM, SIGHUP: the step finishes and a checkpoint is saved, run.start's
handler), before the first step one that stops it at once (Stopped), and --idle-stop steps in a row that learned
nothing (IDLE_EXIT, said first by idle_note). A reward that never returns: harness/reward_worker.py."""
import signal


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # each: finish the step, save, stop


IDLE_EXIT = 3  # train.py's exit code after --idle-stop steps in a row that learned nothing (a checkpoint saved)


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


class Stopped(BaseException):
    """Ctrl-C, SIGTERM or SIGHUP before the run's first step (model loading, the warm start): nothing to save;
    train.py exits with the signal's code. A BaseException, like KeyboardInterrupt, so no `except Exception`
    swallows it."""
    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum
