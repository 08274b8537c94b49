"""Whether the run learns, said in words: the notes a run prints at its evals and in its end table.

What each note means, what it cannot see, and its advice: docs/tasks.md, "When a run says it learns
nothing".
"""
import collections
import math
import statistics

from harness.config import DEFAULT_PATIENCE

TARGET_GRID = 0.05       # a suggested --warm-start-target: the first multiple of this at least TARGET_GRID above
MAX_TARGET = 0.9         # the constant answer's pass@1; above MAX_TARGET no target can tell the answers apart
MAX_WARM_STEPS = 6000    # --warm-start-steps is suggested (doubled) only up to this: 4 x its default
COLLAPSED_SHARE = 0.5    # one greedy answer for at least this share of the held-out prompts
CONSTANT_CHECKED = 0.25  # a start's most common answer is scored as a constant answer from this share on
MIN_PROMPTS = 8          # fewer held-out prompts: too few to call anything collapsed or constant
FLAT_EVALS = 4           # evals after the start before "flat" is said
REWARD_WINDOW = 10       # train rows averaged at each end of the train-reward trend


def top_answer(samples):
    """(the most common greedy completion, its share of the prompts) of an eval's (completion, reward) samples."""
    if not samples:
        return None, 0.0
    answer, count = collections.Counter(text.strip() for text, _ in samples).most_common(1)[0]
    return answer, count / len(samples)


def noise(first, now):
    """Twice the standard error of the difference of two evals' pass@1 (unpaired: an upper bound for the same
    prompts)."""
    return 2 * math.sqrt(first.get("pass@1_se", 0.0) ** 2 + now.get("pass@1_se", 0.0) ** 2)


NO_FLAG = ("no flag is likely to help: the tiny model (about 2M parameters, trained on the task's own solutions) "
           "has not learned what makes this task's answers differ from prompt to prompt, and a longer warm start "
           "repeats what did not gain. Try a real model (--model smollm2, or a Hugging Face id), a denser reward (partial "
           "credit, so that a near answer scores above the constant one), or a task whose solutions the warm start "
           "can imitate (a solution() that spells out the steps to the answer)")


def warm_start_stop(warm):
    """Why the warm start stopped: warm["stopped"] (tiny.warm_start's info), or, for a cache written before it was
    kept, what its numbers imply ("target" reached, "steps" spent, or else "patience" ran out)."""
    if "stopped" in warm:
        return warm["stopped"]
    return "target" if warm["pass@1"] >= warm["target"] else "steps" if warm["steps"] >= warm["max_steps"] else \
        "patience"


def target_above(value):
    """A --warm-start-target above `value` by at least TARGET_GRID, on the TARGET_GRID grid."""
    return round(math.ceil(round((value + TARGET_GRID) / TARGET_GRID, 6)) * TARGET_GRID, 2)


def warm_start_advice(warm, constant_pass):
    """What to change when the tiny model's warm start left a degenerate start (docs/tasks.md),
    moving the stop past what was seen. warm: tiny.warm_start's info ({"steps": 0} for none, None
    unknown); constant_pass: the pass@1 of the most common answer given to every prompt."""
    floor = constant_pass or 0.0
    if warm is not None and warm.get("steps") == 0:
        return ("give it a warm start (--warm-start-steps 1500), so RL starts from a policy that answers the prompts "
                "apart")
    if warm is None:
        target = target_above(floor)
        return (f"raise --warm-start-target to {target:g} (above the constant answer's pass@1 {floor:.3f}), so the "
                "warm start stops only once it does better than one answer for all" if target <= MAX_TARGET else
                f"the constant answer already passes {floor:.0%} of the prompts: the reward cannot tell the answers "
                "apart; a task whose answer varies more")
    stop, best, patience = warm_start_stop(warm), warm.get("best", warm["pass@1"]), warm["patience"]
    if stop == "target":
        target = target_above(max(floor, warm["target"]))
        if target <= MAX_TARGET:
            return (f"the warm start stopped at step {warm['steps']}, when it reached --warm-start-target "
                    f"{warm['target']:g}, which the constant answer's pass@1 ({floor:.3f}) already meets or is "
                    "near; "
                    f"raise --warm-start-target to {target:g}, so it stops only once it beats one answer for all")
        return (f"the constant answer already passes {floor:.0%} of the prompts, so no --warm-start-target can make "
                "the warm start tell the answers apart; " + NO_FLAG)
    if stop == "steps":
        if 2 * warm["max_steps"] <= MAX_WARM_STEPS:
            return (f"the warm start used all its --warm-start-steps {warm['max_steps']} (best pass@1 {best:.3f}, "
                    f"its patience not run out); raise --warm-start-steps to {2 * warm['max_steps']}")
        return f"the warm start used all its {warm['max_steps']} steps (best pass@1 {best:.3f}); " + NO_FLAG
    gave_up = (f"the warm start gave up at step {warm['steps']}: its best pass@1 {best:.3f} did not rise for "
               f"{patience * warm['eval_every']} steps (--warm-start-patience {patience}), below its target "
               f"{warm['target']:g}")
    if patience < DEFAULT_PATIENCE:  # no verdict before the default patience was tried (issue 82)
        return (f"{gave_up}; raise --warm-start-patience to {DEFAULT_PATIENCE}, the default, "
                "before giving up on it")
    if best > floor + TARGET_GRID and patience == DEFAULT_PATIENCE:
        return (f"{gave_up}, yet above the constant answer ({floor:.3f}): raise --warm-start-patience to "
                f"{4 * patience}, so it trains on while its gains are slow")
    return f"{gave_up} and {'no higher than' if best <= floor + TARGET_GRID else 'little above'} the constant " \
        f"answer's {floor:.3f}; " + NO_FLAG


def shown(text, limit=40):
    return repr(text if len(text) <= limit else text[:limit] + "...")


class Watch:
    """The notes of one run: start() at the step-0 eval, later_eval() at each later one, train_row() for each step's
    row, verdict() for the end table. Each kind of note is said once; the verdict repeats what was found."""

    def __init__(self, tiny, warm_start=None, advise=None):
        self.tiny = tiny                  # the tiny model: its warm start is what a degenerate start blames
        self.warm_start = warm_start      # what its warm start saw, for warm_start_advice (None: unknown)
        self.advise = advise or (lambda kind: "")  # kind -> "; try ..." (a run's: advice.flags_to_try)
        self.first = None                 # the step-0 eval's result
        self.evals = 0                    # evals after the start
        self.best = None                  # the best pass@1 after the start
        self.rose = False                 # an eval after the start above it by more than the two evals' noise
        self.found = {}                   # kind -> the short form of its note, for the verdict
        self.evals_seen = []              # (step, result) of each eval after the start (harness/advice.py's verdict)
        self.reward_rows = []             # (step, reward_mean) of each train row, in step order

    def train_row(self, row):
        self.reward_rows.append((row.get("step", len(self.reward_rows) + 1), row.get("reward_mean")))

    def start(self, result, samples, constant_pass=None):
        """The step-0 eval -> its note, or None. constant_pass: the pass@1 of answering the most common greedy
        answer to every held-out prompt."""
        self.first = result
        answer, share = top_answer(samples)
        collapsed = len(samples) >= MIN_PROMPTS and share >= COLLAPSED_SHARE
        constant = constant_pass is not None and 0 < constant_pass and result["pass@1"] <= constant_pass
        if not (collapsed or constant):
            return None
        what = "the warm start ended" if self.tiny else "the initial policy is"
        seen = (f"{shown(answer)} for {share:.0%} of the {len(samples)} held-out prompts" if collapsed else
                f"pass@1 {result['pass@1']:.3f}, which answering {shown(answer)} to every prompt reaches "
                f"({constant_pass:.3f})")
        self.found["degenerate start"] = f"{what} degenerate ({seen})"
        fix = (warm_start_advice(self.warm_start, constant_pass) if self.tiny else "warm it up on the task first "
               "(supervised), or raise --temperature so the groups differ")
        return (f"note: {what} degenerate before RL: {seen}. RL samples around one answer, so most groups tie "
                f"and the gradient pushes toward that answer; {fix} (docs/tasks.md)")

    def later_eval(self, step, result, samples):
        """A later eval -> its new notes (a list, often empty)."""
        if self.first is None:
            return []
        self.evals_seen.append((step, result))
        self.evals += 1
        self.best = result["pass@1"] if self.best is None else max(self.best, result["pass@1"])
        notes, start, now = [], self.first["pass@1"], result["pass@1"]
        margin = noise(self.first, result)
        if start - now > margin and "fell" not in self.found:
            trend = self.reward_trend()
            apart = trend is not None and trend[1] - trend[0] > 0.05
            self.found["fell"] = f"held-out pass@1 fell {start:.3f} -> {now:.3f}"
            notes.append(
                f"note: step {step}: held-out pass@1 fell to {now:.3f} from {start:.3f} where RL started (more than "
                f"the evals' noise, {margin:.3f})" + (f", while the train reward rose {trend[0]:.3f} -> "
                                                      f"{trend[1]:.3f}: the policy learns the train prompts' reward, "
                                                      "not the task" if apart else "")
                + ". Likely: a step too large (lower --lr), a collapse onto one answer, a reward that pays for "
                "something else" + self.advise("fell"))
        self.rose = self.rose or now - start > margin
        trend = self.reward_trend()
        if self.evals >= FLAT_EVALS and not self.rose and trend is not None and trend[1] - trend[0] <= trend[2] \
                and "flat" not in self.found and "fell" not in self.found:
            self.found["flat"] = f"held-out pass@1 flat at {start:.3f} over {self.evals} evals, the train reward too"
            notes.append(
                f"note: step {step}: held-out pass@1 is flat ({start:.3f} at the start, at best {self.best:.3f} in "
                f"{self.evals} evals, each within the two evals' noise) and so is the train reward ({trend[0]:.3f} -> "
                f"{trend[1]:.3f}, within its noise {trend[2]:.3f}). Likely: groups that all tie (see "
                "zero_var_share), too small a step, a start too weak to sample a success"
                + self.advise("flat"))
        answer, share = top_answer(samples)
        if len(samples) >= MIN_PROMPTS and share >= COLLAPSED_SHARE and "collapsed" not in self.found \
                and "degenerate start" not in self.found:
            self.found["collapsed"] = f"greedy answers collapsed onto {shown(answer)} ({share:.0%})"
            notes.append(
                f"note: step {step}: the greedy answers collapsed: {shown(answer)} for {share:.0%} of the "
                f"{len(samples)} held-out prompts. Likely: a step too large, a reward that pays that answer often"
                + self.advise("collapsed"))
        return notes

    def reward_trend(self):
        """(mean train reward of the first REWARD_WINDOW rows, of the last ones, twice the SE of
        their difference, 2 sqrt(sd_first^2 + sd_last^2) / sqrt(REWARD_WINDOW)), else None."""
        rewards = [r for _, r in self.reward_rows if r is not None]
        if len(rewards) < 2 * REWARD_WINDOW:
            return None
        first, last = rewards[:REWARD_WINDOW], rewards[-REWARD_WINDOW:]
        return (statistics.fmean(first), statistics.fmean(last),
                2 * math.sqrt((statistics.variance(first) + statistics.variance(last)) / REWARD_WINDOW))

    def verdict(self, moved=None):
        """The end table's line on learning: what the notes found, or None when they found nothing. moved: the end
        verdict's word (harness/advice.py: "gain", "rose", ...), which supersedes a note that said the opposite
        earlier (a "flat" when the run gained or its train reward rose; a "fell" when it gained)."""
        superseded = {"gain": ("flat", "fell"), "rose": ("flat",)}.get(moved, ())
        found = [said for kind, said in self.found.items() if kind not in superseded]
        if not found:
            return None
        return "this run may not be learning: " + "; ".join(found) + " (the notes above say why)"
