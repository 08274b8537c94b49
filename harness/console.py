"""What a run prints: one line at a time beside the loop's progress bar (tqdm), and the bar's own numbers."""
import sys

from tqdm import tqdm


SAMPLES_SHOWN = 3  # greedy completions printed at each eval (the first held-out prompts)


def say(text):
    """A line on stdout that does not collide with the loop's progress bar (tqdm.write)."""
    tqdm.write(text)
    sys.stdout.flush()


# The bar: tqdm's own, without its seconds per step (progress_line has the step's own, the rollout and update)
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"


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


def before_after(state, config, eval_size, before, after):
    """train.py's end table: held-out greedy pass@1 (+/- its standard error over the prompts) and reward of the
    initial and the final weights, then what was trained and where the metrics are."""
    print(f"\n{f'held-out, greedy, {eval_size} prompts':<32}{'pass@1':>8}{'+/- se':>8}{'reward':>8}")
    before_label = "before RL" + (" (after warm start)" if config.model == "tiny" else "")
    for label, result in [(before_label, before), (f"after RL (step {state.step})", after)]:
        print(f"{label:<32}{result['pass@1']:>8.3f}{result.get('pass@1_se', 0.0):>8.3f}{result['reward']:>8.3f}")
    print(f"{state.trained_line()}\nmetrics: {state.metrics_path}")
