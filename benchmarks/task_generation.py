"""Speed of the task generators and verifiers, and how often the official rules and ours disagree (figures from
a script, not a timed test).

    python benchmarks/task_generation.py            # generation, 1 MB hostile inputs, rules comparison
    taskset -c 0 python benchmarks/task_generation.py --n 1000   # pinned to one core
    python benchmarks/task_generation.py --skip-generation --problems 40

Prints wall-clock seconds for generation, the slowest reward call (ms) on each hostile completion for every task
and rule set (target: under 50 ms), text_match's time and peak memory on a 5 000-token reference against a 1 MB
completion and on 1 MB against 1 MB, math-verify's deadline on a slow answer, and the number of checked
completions whose reward differs between the official rules and ours. The math tasks need math-verify
(pip install math-verify).
"""

import argparse
import json
import os
import random
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tasks import MATH_DEADLINE_S, get_task, math_helper_process  # noqa: E402
from tasks.countdown_solver import solve  # noqa: E402

MB = 1_000_000
HOSTILE = {
    "__import__": "__import__('os').system('echo pwned')",
    "9**9**9**9": "9**9**9**9",
    "10k nested (": "(" * 10_000 + "1" + ")" * 10_000,
    "\\boxed{ + 1 MB": "\\boxed{" + "7" * MB,
    "1 MB digits": "7" * MB,
    "1 MB 1+1+": "1+" * (MB // 2) + "1",
    "1e5-deep braces": "{" * 100_000 + "42" + "}" * 100_000,
    "100k \\boxed{": "\\boxed{" * 100_000,
    "100k <answer>": "<answer>" * 100_000,
    "1 MB words": "knight cat " * (MB // 11),
    "1 MB spaces": "Alice is a knight" + " " * MB + "Bob is a knave",
    "non-ASCII digits": "١٢*٥-٣ ٤٢ ٣",
}


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def data_tasks(folder):
    """gsm8k (both rules), deepmath and text_match on small generated files."""
    def write(name, rows):
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        return path
    gsm = write("gsm8k.jsonl", [{"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"} for i in range(50)])
    deep = write("deepmath.jsonl", [{"question": f"{i}/2?", "final_answer": f"\\frac{{{i}}}{{2}}"} for i in range(50)])
    text = write("text.jsonl", [{"prompt": f"Line {i}", "reference": "the quick brown fox jumps over the lazy dog " * 8}
                                for i in range(50)])
    return [get_task("gsm8k", data=gsm, rules="last_number"), get_task("gsm8k", data=gsm),
            get_task("deepmath", data=deep), get_task("text_match", data=text)]


def hostile_table(task_list, repeats):
    print(f"\n== slowest of {repeats} reward calls, ms (chat: inside <think>/<answer> tags | compact: bare) ==")
    labels = [f"{t.name}:{t.rules}" for t in task_list]
    print(f"{'input':18s}" + "".join(f"{label[:22]:>24s}" for label in labels))
    for label, hostile in HOSTILE.items():
        cells = []
        for task in task_list:
            example = task.examples("train", 1, seed=0)[0]
            task.reward("<answer> 1 </answer>", example)  # warm up (math: the helper process starts here)
            worst = 0.0
            for _ in range(repeats):
                for style, completion in (("chat", f"<think>x</think><answer>{hostile}</answer>"),
                                          ("chat", hostile), ("compact", hostile)):
                    reward, seconds = timed(lambda: task.reward(completion, example, style=style))
                    worst = max(worst, seconds)
            cells.append(f"{1000 * worst:9.2f} (r={reward:+.2f})")
        print(f"{label:18s}" + "".join(f"{c:>24s}" for c in cells))


def text_match_big(text_task):
    reference = " ".join(f"word{i % 3000}" for i in range(5000))  # 5 000 tokens, 3 000 distinct
    example = {"prompt": "p", "reference": reference}
    text_task.reward("warm up", example)  # the reference's tokens are cached from here on
    print("\n== text_match: 5 000-token reference vs 1 MB completions (ms; peak MiB under tracemalloc) ==")
    for label, completion in (("reference + 1 MB filler", reference + " lorem ipsum" * (MB // 12)),
                              ("1 MB of reference words", (reference + " ") * (MB // len(reference))),
                              ("1 MB filler + reference", "lorem ipsum " * (MB // 12) + reference)):
        text_match_row(text_task, label, completion, example)
    # both sides 1 MB: past LCS_CELLS the ROUGE-L LCS is the sum over aligned pieces (a lower bound); the reference's
    # tokens are normalised in the first, timed call (its cache is cleared first)
    print("\n== text_match: 1 MB completion vs 1 MB reference, reference tokens not cached (ms; peak MiB) ==")
    shuffled = [f"w{i}" for i in range(110_000)]
    random.Random(0).shuffle(shuffled)
    for label, completion, reference in (
            ("identical (common start)", "w " * (MB // 2), "w " * (MB // 2)),
            ("no shared word", "x " * (MB // 2), "y " * (MB // 2)),
            ("x y ... vs y x ...", "x y " * (MB // 4), "y x " * (MB // 4)),
            ("110k words, shuffled", " ".join(f"w{i}" for i in range(110_000)), " ".join(shuffled))):
        text_match_row(text_task, label, completion, {"prompt": "p", "reference": reference}, clear_cache=True)


def text_match_row(text_task, label, completion, example, clear_cache=False):
    from tasks.text_match import reference_tokens
    if clear_cache:
        reference_tokens.cache_clear()
    reward, seconds = timed(lambda: text_task.reward(completion, example))
    if clear_cache:
        reference_tokens.cache_clear()
    tracemalloc.start()
    text_task.reward(completion, example)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"{label:26s} {1000 * seconds:7.1f} ms  peak {peak / 2**20:5.1f} MiB  reward {reward:.3f}")


def math_deadline(gsm_task):
    example = {"question": "q", "answer": "7", "rationale": ""}
    print(f"\n== math-verify on answers sympy is slow on (deadline {MATH_DEADLINE_S} s per answer) ==")
    for answer in ("\\boxed{2^{99999999}}", "\\boxed{2^{999999999}}"):
        gsm_task.reward("<answer> 7 </answer>", example)  # helper started and warm
        helper = math_helper_process()
        _, seconds = timed(lambda: gsm_task.reward(f"<answer> {answer} </answer>", example))
        killed = math_helper_process() is not helper
        _, after = timed(lambda: gsm_task.reward("<answer> 7 </answer>", example))
        print(f"{answer:24s} {seconds:5.2f} s, helper {'killed' if killed else 'kept'}; next answer {after:.2f} s")


# ---------------------------------------------------------------------------------------------------------
# Official rules against ours on the same completions: the chat-style formats a model writes, right and wrong.
def countdown_completions(example):
    e = solve(tuple(example["numbers"]), example["target"])
    t = example["target"]
    wrong = e[:-1] + str((int(e[-1]) + 1) % 10) if e[-1].isdigit() else e + "+0"
    spaced = " ".join(e)
    unicode_ops = spaced.replace("*", "×").replace("/", "÷").replace("-", "−")
    answers = [e, spaced, f"{e} = {t}", f"{e}={t}.0", f"{e} = {t}/1", unicode_ops, f"\\boxed{{{e}}}", f"${e}$",
               f"`{e}`", f"{e}.", f"The answer is {e}", wrong, f"{wrong} = {t}", f"({e})", f"{e} = {t} = {t}"]
    out = []
    for a in answers:
        out += [f"<think> trying </think> <answer> {a} </answer>", f"<think> trying </think> {a}", a,
                f"<think> <answer> {a} </answer> </think> done", f"<answer> {a} </answer>"]
    return out


def knights_completions(example):
    names, knights = [n.capitalize() for n in example["names"]], example["knights"]
    role = ["knight" if k else "knave" for k in knights]
    opposite = ["knave" if k else "knight" for k in knights]
    answers = ["\n".join(f"({i + 1}) {n} is a {r}" for i, (n, r) in enumerate(zip(names, role))),
               ", ".join(f"{n} is a {r}" for n, r in zip(names, role)).lower(),
               ", ".join(f"{n}: {r}" for n, r in zip(names, role)),
               ", ".join(f"{n} is not a {o}" for n, o in zip(names, opposite)),
               ", ".join(f"{n} is an {r}" for n, r in zip(names, role)),
               ", ".join(f"{n} is a {r}s" for n, r in zip(names, role)),
               ", ".join(f"{n} is a {r}" for n, r in zip(names, opposite)),
               ", ".join(f"{n} is a {r}" for n, r in zip(names[:-1], role)),
               ", ".join(f"{n} is a {r}" for n, r in zip(names, role)) + ". Knights tell the truth."]
    out = []
    for a in answers:
        out += [f"<think> cases </think> <answer> {a} </answer>", f"<think> cases </think><answer>{a}</answer>",
                f"cases </think> <answer> {a} </answer>", f"<answer> {a} </answer>", a]
    return out


def gsm8k_completions(example):
    n = int(example["answer"])
    answers = [f"{n}", f"\\boxed{{{n}}}", f"${n}$", f"{n}.0", f"{n:,}", f"{n} dollars", f"\\frac{{{2 * n}}}{{2}}",
               f"\\boxed{{\\frac{{{2 * n}}}{{2}}}}", f"{n + 1}", f"It is {n} or {n + 1}", f"{n}e0"]
    out = []
    for a in answers:
        out += [f"<think> work </think> <answer> {a} </answer>", f"<think> {a} </think> I am not sure",
                f"The answer is {a}"]
    return out


def compare_rules(problems, folder):
    print(f"\n== official rules vs ours: completions whose reward differs ({problems} problems each) ==")
    rows = [("countdown", get_task("countdown"), get_task("countdown", rules="lenient"), countdown_completions),
            ("knights_knaves", get_task("knights_knaves"), get_task("knights_knaves", rules="lenient"),
             knights_completions)]
    gsm = os.path.join(folder, "gsm8k.jsonl")
    rows.append(("gsm8k", get_task("gsm8k", data=gsm), get_task("gsm8k", data=gsm, rules="last_number"),
                 gsm8k_completions))
    for name, official, ours, make in rows:
        examples = official.examples("train", problems, seed=0) if name != "gsm8k" else \
            official.examples("train", None, seed=0)[:problems]
        checked = differ = official_only = 0
        for example in examples:
            for completion in make(example):
                a, b = official.reward(completion, example), ours.reward(completion, example)
                checked += 1
                differ += a != b
                official_only += a > b
        print(f"{name:15s} {official.rules:>12s} vs {ours.rules:<12s} {differ:5d} of {checked:5d} differ "
              f"({official_only} score higher under the official rules)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="problems / puzzles to generate")
    parser.add_argument("--repeats", type=int, default=3, help="reward calls per hostile input")
    parser.add_argument("--problems", type=int, default=40, help="problems per task in the rules comparison")
    parser.add_argument("--skip-generation", action="store_true")
    args = parser.parse_args()

    if not args.skip_generation:
        print(f"== generation ({args.n} each, seed 0) ==")
        for label, options in (("countdown 3-4 numbers", {}), ("countdown 3 numbers", {"num_count": 3}),
                               ("countdown 4 numbers", {"num_count": 4})):
            solve.cache_clear()
            _, seconds = timed(lambda: get_task("countdown", **options).examples("train", args.n, seed=0))
            print(f"{label:28s} {seconds:6.2f} s   ({1000 * seconds / args.n:.2f} ms each)")
        _, seconds = timed(lambda: get_task("knights_knaves").examples("train", args.n, seed=0))
        print(f"{'knights_knaves 3-5 people':28s} {seconds:6.2f} s   ({1000 * seconds / args.n:.2f} ms each)")
        for people in (6, 7, 8):
            count = max(args.n // 20, 1)
            _, seconds = timed(lambda: get_task("knights_knaves", people=people).examples("train", count, seed=0))
            print(f"{f'knights_knaves {people} people':28s} {seconds:6.2f} s   ({1000 * seconds / count:.2f} ms each, "
                  f"{count} puzzles)")

    with tempfile.TemporaryDirectory() as folder:
        data = data_tasks(folder)
        task_list = [get_task("countdown"), get_task("countdown", rules="lenient", format_score=0.1),
                     get_task("knights_knaves"), get_task("knights_knaves", rules="lenient"), *data]
        hostile_table(task_list, args.repeats)
        text_match_big(data[-1])
        math_deadline(data[1])
        compare_rules(args.problems, folder)


if __name__ == "__main__":
    main()
