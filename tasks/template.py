"""A complete task of your own, to copy: exact-match questions and answers from a JSONL file.

    python train.py --task tasks/template.py --data tasks/template_qa.jsonl            # the tiny model, offline
    python train.py --task tasks/template.py --data tasks/template_qa.jsonl --model smollm2

Each line of the file is {"prompt": "what is 7 plus 5?", "answer": "12"}; a tenth of the rows are held out for the
evals (tasks/_data.py). Only make_task and reward are required: without examples() the rows of --data are the
examples, without prompt() a chat prompt is the row's "prompt" as the user's message, without solution() there is
no warm start (docs/tasks.md, "Write your own task").
"""
import re


class ExactAnswer:
    name = "exact_answer"
    pass_threshold = 1.0  # a completion passes when its reward reaches this

    def prompt(self, example, style="chat"):
        if style == "compact":  # the tiny model's character vocabulary: lower case, digits, a few signs
            return example["prompt"].lower().rstrip("?") + ":"
        return [{"role": "user", "content": example["prompt"] + " Reply with the answer only."}]

    def reward(self, completion, example, style="chat"):
        """1.0 when the completion's answer (inside <answer> tags if it has them, else its last line) equals the
        row's answer, ignoring case, spaces and a final full stop; else 0.0."""
        tagged = re.findall(r"<answer>(.*?)</answer>", completion, flags=re.S)
        lines = completion.strip().splitlines() or [""]
        answer = tagged[-1] if tagged else lines[-1]
        normal = lambda text: " ".join(text.lower().split()).rstrip(".")  # noqa: E731
        return float(normal(answer) == normal(example["answer"]))

    def solution(self, example, style="compact"):
        """What the tiny model's warm start imitates (supervised, before RL)."""
        return example["answer"]


def make_task(data=None):
    """--data: the JSONL file (its rows reach examples through tasks/custom.py); --task-option KEY=VALUE would
    arrive here as keyword arguments."""
    return ExactAnswer()
