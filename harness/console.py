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
