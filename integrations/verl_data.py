"""Our tasks as verl data: train/test parquet files in RLHFDataset's schema, and a verl reward function.

    python -m integrations.verl_data --task countdown --out data/verl/countdown --train 20000 --test 512
    # then, in the verl launch:
    #   data.train_files=data/verl/countdown/train.parquet data.val_files=data/verl/countdown/test.parquet
    #   reward.custom_reward_function.path=integrations/verl_data.py reward.custom_reward_function.name=compute_score

One row per problem (verl samples the M completions itself): `prompt` (the task's chat messages),
`data_source`, `ability`, `reward_model` {"style": "rule", "ground_truth": JSON of the task's
example}, `extra_info` {"index", "split", "task", "task_data", "task_options"}. The example is JSON
text because the tasks' example dicts differ; compute_score reads it back and grades it with the
task's own reward (chat style).
"""
import argparse
import json
import os
import sys
from functools import lru_cache

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # verl loads this file by path
from tasks import get_task  # noqa: E402

DATA_SOURCE_PREFIX = "softmax_grpo_lopti/"


def verl_rows(task_name, split, n, seed, data=None, **task_options):
    """n rows of `split` (train/test never share a problem) for RLHFDataset, as a list of dicts.

    data: the task's data= file (gsm8k, text_match); its absolute path goes into extra_info for compute_score."""
    task = get_task(task_name, data=data, **task_options)
    if getattr(task, "assistant_prefill", ""):  # verl renders the chat template itself, without a prefill
        raise ValueError(f"{task_name}: an assistant prefill (e.g. think_prefill=true) is for train.py only; verl "
                         "would sample without it and score the completion as if it had one")
    options = json.dumps(task_options, sort_keys=True)
    data = os.path.abspath(data) if data else ""
    return [{"prompt": task.prompt(example, "chat"),
             "data_source": DATA_SOURCE_PREFIX + task_name,
             "ability": task_name,
             "reward_model": {"style": "rule", "ground_truth": json.dumps(example, sort_keys=True)},
             "extra_info": {"index": i, "split": split, "task": task_name, "task_data": data,
                            "task_options": options}}
            for i, example in enumerate(task.examples(split, n, seed=seed))]


def write_parquet(rows, path):
    """Write rows to a parquet file (pyarrow, a dependency of verl and of `datasets`)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise SystemExit("writing parquet needs pyarrow: pip install pyarrow") from None
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_task_parquets(task_name, out_dir, n_train, n_test, seed=0, data=None, **task_options):
    """<out_dir>/train.parquet and <out_dir>/test.parquet; returns their paths."""
    return tuple(write_parquet(verl_rows(task_name, split, n, seed, data, **task_options),
                               os.path.join(out_dir, f"{split}.parquet"))
                 for split, n in (("train", n_train), ("test", n_test)))


def _options(options_json):
    """get_task options from JSON; lists back to tuples (e.g. people=(3, 4, 5))."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(options_json).items()}


@lru_cache(maxsize=None)
def _task(task_name, task_data, task_options_json):
    return get_task(task_name, data=task_data or None, **_options(task_options_json))


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **_):
    """verl custom_reward_function: the task's reward of one decoded completion (chat style), a float.

    The task comes from extra_info (task, task_options) written by verl_rows, else from data_source
    "softmax_grpo_lopti/<task>" with default options; ground_truth is the example as JSON.
    """
    extra_info = extra_info or {}
    task_name = extra_info.get("task")
    if task_name is None:
        if not str(data_source).startswith(DATA_SOURCE_PREFIX):
            raise ValueError(f"compute_score: data_source {data_source!r} is not one of ours ({DATA_SOURCE_PREFIX}<task>)")
        task_name = str(data_source)[len(DATA_SOURCE_PREFIX):]
    task = _task(task_name, extra_info.get("task_data") or "", extra_info.get("task_options") or "{}")
    return float(task.reward(solution_str, json.loads(ground_truth), style="chat"))


def main(argv=None):
    parser = argparse.ArgumentParser(description="write train/test parquet files of one task for verl")
    parser.add_argument("--task", required=True, help="countdown | knights_knaves | gsm8k | text_match")
    parser.add_argument("--out", required=True, help="output folder (train.parquet, test.parquet)")
    parser.add_argument("--train", type=int, default=20000, help="training problems")
    parser.add_argument("--test", type=int, default=512, help="held-out problems")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default=None, help="the task's data file (gsm8k, text_match)")
    parser.add_argument("--task-options", default="{}", help='JSON get_task options, e.g. \'{"people": [3, 4, 5, 6, 7]}\'')
    args = parser.parse_args(argv)
    try:
        options = _options(args.task_options)
    except json.JSONDecodeError as error:
        parser.error(f"--task-options is not JSON: {error}")
    for path in write_task_parquets(args.task, args.out, args.train, args.test, args.seed, args.data, **options):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
