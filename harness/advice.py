"""What a run tells its user after its evals: the verdict on whether RL changed the policy, what its
noise needs to decide more (prompts_needed, rows_needed), the flags its notes advise (flags_to_try)
and the command that resumes (docs/tasks.md, "When a run says it learns nothing", in words).

The verdict, decided here and nowhere else, each piece of evidence against its own noise:

  held-out  each eval's pass@1 against step 0's: d, noise m = 2 sqrt(se_0^2 + se^2); a gain (loss)
            is resolved at CONFIRM evals in a row beyond m, and holds until CONFIRM evals come back
            within m / 2 (hysteresis).
  train     the least-squares slope b of reward_mean against step, se_b = s / sqrt(sum (step -
            mean)^2); a rise (fall) when b > 2 se_b (b < -2 se_b), from MIN_TREND_ROWS rows on.
  verdict   a resolved held-out change; else the train trend; else neither moved. NaN: no verdict.
"""
import math
import shlex

import tasks
from harness.config import MAX_GENERATIONS
from harness.watch import MAX_TARGET, target_above

CONFIRM = 2            # evals in a row that resolve a held-out change, or that end one
MIN_TREND_ROWS = 10    # train rows before the train reward's trend is fitted
MAX_STEPS_FACTOR = 10  # steps advised for the train trend: at most this many times the steps run


def finite(*values):
    return all(isinstance(value, (int, float)) and math.isfinite(value) for value in values)


def held_out_change(first, now):
    """(d, m): now's pass@1 minus first's, and twice the standard error of that difference (unpaired: an upper bound
    for the same prompts); (nan, nan) when a pass@1 or se is not a number."""
    values = (first.get("pass@1"), now.get("pass@1"), first.get("pass@1_se", 0.0), now.get("pass@1_se", 0.0))
    if not finite(*values):
        return math.nan, math.nan
    return values[1] - values[0], 2 * math.hypot(values[2], values[3])


def side(first, now):
    """Where one eval stands against the start: "gain"/"loss" (beyond m), "back" (within m / 2), "between"."""
    d, m = held_out_change(first, now)
    return "gain" if d > m else "loss" if -d > m else "back" if abs(d) <= m / 2 else "between"


def held_out_state(first, evals):
    """-> (state, step): the held-out verdict after evals [(step, result)] in step order, "gain", "loss" or None,
    and the step of the eval that resolved it (the rule in the module docstring)."""
    sides = [side(first, result) for _, result in evals]
    if len(evals) == 1:
        return (sides[0], evals[0][0]) if sides[0] in ("gain", "loss") else (None, None)
    state, since = None, None
    for k in range(CONFIRM - 1, len(sides)):
        window = set(sides[k - CONFIRM + 1:k + 1])
        if len(window) == 1 and window <= {"gain", "loss"} and window != {state}:
            state, since = sides[k], evals[k][0]
        elif window == {"back"} and state is not None:
            state, since = None, None
    return state, since


def reward_trend(rows):
    """rows: (step, reward_mean) of the train rows -> {"b", "se", "s", "n", "first", "last", "steps"} (the fitted
    line's slope, its standard error, the residual sd, the rows, the fitted reward at the first and last step, and
    those steps), or None under MIN_TREND_ROWS finite rows."""
    rows = [(step, reward) for step, reward in rows if finite(step, reward)]
    if len(rows) < MIN_TREND_ROWS:
        return None
    n = len(rows)
    mean_x = sum(step for step, _ in rows) / n
    mean_y = sum(reward for _, reward in rows) / n
    sxx = sum((step - mean_x) ** 2 for step, _ in rows)
    if sxx == 0:
        return None
    b = sum((step - mean_x) * (reward - mean_y) for step, reward in rows) / sxx
    residual = sum((reward - mean_y - b * (step - mean_x)) ** 2 for step, reward in rows)
    s = math.sqrt(residual / (n - 2))
    first, last = rows[0][0], rows[-1][0]
    return {"b": b, "se": s / math.sqrt(sxx), "s": s, "n": n, "steps": (first, last),
            "first": mean_y + b * (first - mean_x), "last": mean_y + b * (last - mean_x)}


def trend_direction(trend):
    """"rose", "fell" or None (within its noise, or no trend)."""
    if trend is None:
        return None
    return "rose" if trend["b"] > 2 * trend["se"] else "fell" if trend["b"] < -2 * trend["se"] else None


def per_prompt_variance(first, now, prompts):
    """v_0 + v: the two evals' per-prompt variances of pass@1, se^2 x prompts each."""
    return sum(result.get("pass@1_se", 0.0) ** 2 * prompts for result in (first, now))


def prompts_needed(first, now, prompts):
    """The held-out prompts that would resolve now's change against first's at its size, 4 (v_0 + v) / d^2, or None
    when there is no change (or no number) to resolve. prompts: each eval's."""
    d, _ = held_out_change(first, now)
    variance = per_prompt_variance(first, now, prompts)
    if not finite(d) or d == 0 or variance == 0:
        return None
    return math.ceil(4 * variance / d ** 2)


def rows_needed(trend):
    """The train rows (one a step) at which the slope so far would be resolved at the rows' noise: the least n with
    n (n^2 - 1) > 48 s^2 / b^2; None without a slope."""
    if trend is None or trend["b"] == 0:
        return None
    bound = 48 * trend["s"] ** 2 / trend["b"] ** 2
    n = max(3, math.ceil(bound ** (1 / 3)))
    while n * (n * n - 1) <= bound:
        n += 1
    return n


def held_out_rows(task, asked, drawn):
    """The task's held-out split's size: its data's test rows (a data task), else `drawn` when the task gave fewer
    than `asked`, else None (a generated split: any size)."""
    splits = getattr(task, "splits", None)
    if isinstance(splits, dict) and isinstance(splits.get("test"), list):
        return len(splits["test"])
    return drawn if drawn < asked else None


def eval_size_note(config, drawn):
    """The line said at start when --eval-size asks for more prompts than the held-out split has, else None."""
    if drawn >= config.eval_size:
        return None
    return (f"note: --eval-size {config.eval_size}: the task's held-out split has {drawn} rows, so each eval uses "
            f"those {drawn}")


def resume_command(config, *flags):
    """The command that continues config's run: --resume with its folder, plus what run.json cannot restore: the
    task when it is your own code (a resume imports only code its command line names) and --inspect-every (not
    saved); then `flags`."""
    words = ["python", "train.py", "--resume", config.output_dir]
    if config.task not in tasks.TASKS:
        words += ["--task", config.task]
    if config.inspect_every:
        words += ["--inspect-every", str(config.inspect_every)]
    return " ".join(shlex.quote(str(word)) for word in [*words, *flags])


def end_lines(config, first, evals, train_rows, prompts, split_rows):
    """The end table's lines on noise and the verdict. first: the step-0 eval; evals: [(step, result)] of the evals
    after it, in step order (the last: the final weights'); train_rows: (step, reward_mean); prompts: each eval's
    held-out prompts; split_rows: the held-out split's size (None: any). -> a list of lines ([] without an eval after
    the start), and the verdict's word: "gain", "loss" (held-out), "rose", "fell" (train), or None."""
    if not evals or first is None:
        return [], None
    step, last = evals[-1]
    d, m = held_out_change(first, last)
    numbers = (f"pass@1 +/- its standard error: {first['pass@1']:.3f} +/- {first.get('pass@1_se', 0.0):.3f} -> "
               f"{last['pass@1']:.3f} +/- {last.get('pass@1_se', 0.0):.3f}; change {d:+.3f}, noise "
               f"2 sqrt(se0^2 + se^2) = {m:.3f}")
    if not finite(d, m):
        return [f"{numbers}: no verdict: a held-out pass@1 or its standard error is not a number (an eval that "
                "failed, or a trainer_state.pt written by another version)"], None
    state, since = held_out_state(first, evals)
    if state is not None:
        said = f"resolved: a {state} beyond the noise"
        if side(first, last) != state:
            said += (f" (resolved at step {since} by {CONFIRM} evals in a row, and held: this eval alone is not "
                     "evidence to withdraw it; harness/advice.py says the rule)")
        return [f"{numbers}: {said}"], state
    alone = side(first, last) in ("gain", "loss")
    lines = [f"{numbers}: " + (f"beyond the noise at this eval alone, which does not resolve a change ({CONFIRM} "
                               "evals in a row do: harness/advice.py says the rule)" if alone else "within noise")]
    trend, direction = reward_trend(train_rows), None
    if trend is not None:
        direction = trend_direction(trend)
        lines.append(f"train reward (reward_mean a step, least-squares line over {trend['n']} rows): "
                     f"{trend['first']:.3f} -> {trend['last']:.3f} over steps {trend['steps'][0]}-{trend['steps'][1]}, "
                     f"slope {trend['b']:+.2e} +/- {trend['se']:.2e} a step: "
                     + (f"{direction} beyond its noise (2 se)" if direction else "within its noise (2 se)"))
    held_out = ("a next eval beyond the noise too would resolve it: "
                f"{resume_command(config, '--steps', step + config.eval_every)}" if alone else
                held_out_needs(first, last, d, prompts, split_rows))
    if direction:
        verdict = (f"verdict: the policy {'learns' if direction == 'rose' else 'loses'} the train reward (it "
                   f"{direction} beyond its noise); held-out pass@1 "
                   + ("is not resolved" if alone else f"moved within its noise {m:.3f}") + f": {held_out}")
    else:
        verdict = f"verdict: neither held-out pass@1 nor the train reward moved beyond its noise: {held_out}"
        more = rows_needed(trend)
        if trend is None:
            verdict += f"; the train reward's trend is fitted from {MIN_TREND_ROWS} train rows on"
        elif more is not None and trend["b"] > 0 and trend["steps"][0] - 1 + more <= MAX_STEPS_FACTOR * step:
            target = trend["steps"][0] - 1 + more
            verdict += (f"; the train reward's slope so far would be resolved at about step {target}: "
                        f"{resume_command(config, '--steps', target)}")
        else:
            verdict += f"; the train reward shows no rise that {MAX_STEPS_FACTOR}x the steps would resolve"
    return lines + [verdict], direction


def held_out_needs(first, last, d, prompts, split_rows):
    """What the held-out eval would need to resolve a change the size of d, within the task's split."""
    needed = prompts_needed(first, last, prompts)
    if needed is None:
        return "no held-out change to resolve"
    if split_rows is not None and needed > split_rows:
        smallest = 2 * math.sqrt(per_prompt_variance(first, last, prompts) / split_rows)
        return (f"a change of {abs(d):.3f} needs about {needed} held-out prompts and the task's split has "
                f"{split_rows}, which resolve changes above {smallest:.3f} (more held-out rows in the data, or a "
                "larger change)")
    where = f" of the split's {split_rows}" if split_rows is not None else ""
    return (f"a change of {abs(d):.3f} needs about {needed} held-out prompts{where} (this eval has {prompts}): a new "
            f"run with --eval-size {needed} (a resume keeps the eval's size)")


LR_FACTOR = 3  # a note's --lr: the run's divided (a fall, a collapse) or multiplied (flat) by this
KL_COST = (" (its cost: a reference model's forward, and every row trained, a tied group's too, where without it a "
           "row of advantage 0 is skipped: the more groups tie, as in a collapse, the slower the update)")


def flags_to_try(settings, kind):
    """The flags a note of harness/watch.py advises, valued from the run's settings, only where they
    change something. -> "; try ..." text, or "" when no flag is left to move."""
    lr, kl, generations, temperature = settings.lr, settings.kl_coef, settings.num_generations, settings.temperature
    advice = []
    if kind in ("fell", "collapsed"):
        advice.append(f"--lr {lr / LR_FACTOR:.2g} (this run: {lr:g})")
        if 10 * kl <= 1:
            advice.append(f"--kl-coef {max(0.01, 10 * kl):g}" + (f" (this run: {kl:g})" if kl else KL_COST))
    target = target_above(settings.warm_start_target)
    if kind == "flat" and settings.model == "tiny" and settings.warm_start_steps and target <= MAX_TARGET:
        advice.append(f"--warm-start-target {target:g} (this run: {settings.warm_start_target:g})")
    if kind in ("fell", "flat") and 2 * generations <= MAX_GENERATIONS:
        advice.append(f"--num-generations {2 * generations} (this run: {generations})")
    if kind == "flat" and temperature < 1.0:
        advice.append(f"--temperature 1.0 (this run: {temperature:g})")
    if kind == "collapsed" and temperature < 1.2:
        advice.append(f"--temperature {min(1.2, temperature + 0.3):g} (this run: {temperature:g})")
    if kind == "flat":
        advice.append(f"--lr {lr * LR_FACTOR:.2g} (this run: {lr:g})")
    return "; try " + ", ".join(advice) if advice else ""
