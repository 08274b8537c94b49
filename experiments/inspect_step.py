"""One RL step, seen: the HTML page (harness/step_page.py) of the step after a checkpoint.

    python -m experiments.inspect_step runs/default              # the step after the run's latest checkpoint
    python -m experiments.inspect_step runs/default/checkpoint-50 --output step51.html
    python train.py --inspect-every 10                            # every 10th step: <output-dir>/inspect/

From a checkpoint the command re-samples the next step as `train.py --resume` would (the run's saved settings, its
optimizer and RNG states), takes the step's update on the loaded copy, and writes the page; nothing in the run
folder changes but the page. The checkpoint is read as --resume reads it: no code from it runs (weights_only,
trust_remote_code=False). How to read the page: docs/runs.md, "See one step".
"""
import argparse
import os
import sys

import torch

from harness.checkpoint import resolve_checkpoint
from harness.files import RunError
from harness.step_page import after_update, before_update

PROG = "python -m experiments.inspect_step"


def inspect_checkpoint(path, *, output=None, device=None, task=None, log=print):
    """Load the checkpoint (or a run folder's latest) as --resume does, sample its next step with the run's saved
    settings, optimizer and RNG states, update the loaded copy, and write the page -> its path. task: the run's
    own task file or module, which (as for --resume) is imported only when named here."""
    from harness.flags import load
    checkpoint = resolve_checkpoint(path, log)
    config = load(["--resume", checkpoint] + (["--device", device] if device else [])
                  + (["--task", task] if task else []), prog=PROG)  # run.json read and checked there
    import train
    from harness.policy import adamw_class, build_policy, restore_trainer_state, set_learning_rate
    from harness.settle import settle
    config, tokenizer, task, prompts = settle(config)
    model, ref_model = build_policy(config, tokenizer, task, log=log)
    optimizer = adamw_class(config)([p for p in model.parameters() if p.requires_grad], lr=config.lr,
                                    weight_decay=config.weight_decay)
    model.train()
    torch.manual_seed(config.seed)  # as RunState.begin: the RL phase's seed, then the checkpoint's RNG
    saved = restore_trainer_state(config.resume, model, optimizer)  # states: the same next step
    step = saved["step"] + 1
    set_learning_rate(optimizer, config, step)
    rollouts, rewards, advantages = train.collect_rollouts(model, tokenizer, task, prompts(step), config)
    record = before_update(config, step, model, tokenizer, task, rollouts, rewards, due=True,
                           source=f"sampled from {os.path.basename(checkpoint)}")
    stats = train.update_batch(model, optimizer, rollouts.input_ids, rollouts.attention_mask,
                               rollouts.completion_mask, advantages, config, ref_model=ref_model)
    return after_update(record, model, stats, path=output)


def main(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description="An HTML page of one RL step: the step after a "
                                     "checkpoint, re-sampled with the run's settings and seed (docs/runs.md).")
    parser.add_argument("run", metavar="RUN_OR_CHECKPOINT", help="a run folder (its latest checkpoint) or a "
                        "checkpoint-<step> folder")
    parser.add_argument("--output", default=None, help="the page's path (default: <run>/inspect/step-<N>.html)")
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: the run's)")
    parser.add_argument("--task", default=None, help="a run of your own task: its file or module, named again "
                        "(as --resume asks; a run folder never chooses code to run)")
    from harness.config import InputError
    from harness.flags import fail
    parser.error = lambda message: fail(message, PROG)  # one line, no usage dump
    args = parser.parse_args(argv)
    if not os.path.isdir(args.run):
        parser.error(f"{args.run}: no such folder")
    try:
        path = inspect_checkpoint(args.run, output=args.output, device=args.device, task=args.task)
    except (RunError, InputError) as error:  # a flag's (--device, --task): 2, as argparse's; the run's files: 1
        print(f"{PROG}: error: {error}", file=sys.stderr)
        sys.exit(2 if isinstance(error, InputError) else 1)
    print(f"wrote {path} ({os.path.getsize(path) / 1024:.0f} KB)")
    return path


if __name__ == "__main__":
    main()
