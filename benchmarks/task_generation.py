"""Speed of the task generators and verifiers (issue 4: figures from a script, not a timed test).

    python benchmarks/task_generation.py            # 1000 Countdown problems, 1000 K&K puzzles, hostile inputs
    taskset -c 0 python benchmarks/task_generation.py --n 1000   # pinned to one core

Prints wall-clock seconds for generation and the slowest reward call (ms) on each hostile completion.
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tasks import get_task  # noqa: E402
from tasks.countdown import solve  # noqa: E402

HOSTILE = {
    "__import__": "__import__('os').system('echo pwned')",
    "9**9**9**9": "9**9**9**9",
    "10k nested (": "(" * 10_000 + "1" + ")" * 10_000,
    "100k chars": "1+" * 50_000 + "1",
    "100k words": "knight cat " * 9_091,
    "non-ASCII digits": "١٢*٥-٣ ٤٢ ٣",
    "5k \\boxed{": "\\boxed{" * 5_000,
}


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def data_tasks(folder):
    gsm, text = os.path.join(folder, "gsm8k.jsonl"), os.path.join(folder, "text.jsonl")
    with open(gsm, "w") as f:
        f.writelines(json.dumps({"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"}) + "\n"
                     for i in range(50))
    with open(text, "w") as f:
        f.writelines(json.dumps({"prompt": f"Line {i}", "reference": "the quick brown fox jumps over the lazy dog " * 8})
                     + "\n" for i in range(50))
    return get_task("gsm8k", data=gsm), get_task("text_match", data=text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="problems / puzzles to generate")
    parser.add_argument("--repeats", type=int, default=20, help="reward calls per hostile input")
    args = parser.parse_args()

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

    print(f"\n== slowest of {args.repeats} reward calls, ms (chat: inside <answer> tags | compact: bare) ==")
    with tempfile.TemporaryDirectory() as folder:
        task_list = [get_task("countdown", format_score=0.1), get_task("knights_knaves"), *data_tasks(folder)]
        print(f"{'input':18s}" + "".join(f"{t.name:>22s}" for t in task_list))
        for label, hostile in HOSTILE.items():
            cells = []
            for task in task_list:
                example = task.examples("train", 1, seed=0)[0]
                worst = 0.0
                for _ in range(args.repeats):
                    for style, completion in (("chat", f"<think>x</think><answer>{hostile}</answer>"),
                                              ("compact", hostile)):
                        reward, seconds = timed(lambda: task.reward(completion, example, style=style))
                        worst = max(worst, seconds)
                cells.append(f"{1000 * worst:9.2f} (r={reward:+.2f})")
            print(f"{label:18s}" + "".join(f"{c:>22s}" for c in cells))


if __name__ == "__main__":
    main()
