"""What runs the lesson, beside it: a reader of the RL algorithm can skip this folder.

    config.py      every setting once (the Config dataclass): its default, its paper value, its checks
    flags.py       the command line generated from Config, --resume's saved settings merged in: load(argv)
    settle.py      settling a run: every setting decided once for this machine, its memory plan checked, --dry-run
    policy.py      the policy, its reference and its optimizer: built fresh, or restored from a checkpoint
    run.py         a run's lifecycle: the folder owned, metrics, evals, checkpoints, Ctrl-C (the RunState)
    stops.py       what stops a run: a signal, a stop before the first step, steps that learn nothing
    console.py     what a run prints: lines beside the progress bar, the bar's numbers, eval samples
    reward_worker.py where a task's reward runs: a worker process (--reward-timeout kills it), one round trip a step
    reward_keeper.py the worker's own side: its keeper (which ends all below it) and the task's build and calls
    prompts.py     the training prompts of each step: fresh draws, or --epochs over a fixed set; their context check
    checkpoint.py  the run folder and its checkpoints: one run at a time, a kill's leftovers put right, --resume
    manifest.py    a model folder written whole, its files bound into one set by their sha256 (manifest.json)
    files.py       safe file writing: a file replaced whole, never through a link, a hard link or a FIFO
    metrics.py     metrics.jsonl: appended a row at a time, read a bounded line at a time, rewritten atomically
    model.py       loading a policy: hub id, local folder, .gguf file, "smollm2", "tiny"
    tiny.py        the tiny offline model: character tokenizer, a small Llama, its CPU defaults and warm start
    memory.py      the memory plan of --dry-run and --memory-budget: what a step holds, per card
    report.py      --report-to tensorboard,wandb: metrics.jsonl's rows and eval samples to a logger
    merge_lora.py  `python -m harness.merge_lora`: a LoRA run's adapters merged into a plain model folder
    watch.py       the notes on learning: a start, a fall, a flat run or a collapse, said in words
    advice.py      the end table's verdict and the notes' advice: what the noise needs, the flags to try
    step_page.py   --inspect-every's HTML page of one step (the command: experiments/inspect_step.py)
    master_weights.py  --param-dtype bf16: the optimizer's fp32 master copies of bf16 weights
    lean_optimizer.py  --param-dtype bf16-sr and --step-in-backward: AdamW on bf16, no masters

The lesson files import nothing from here (tests/test_train.py); train.py's loop and `main` do.
config.py, flags.py and their imports load no torch, so `--help` answers without it.
"""
import logging

# Library noise at import (torchao's kernels built for another Python or CUDA; its Enums on torch's
# pytree), each dropped by its own message on its own logger: every other warning still shows
# (tests/test_run_feedback.py).
LIBRARY_NOISE = {"torchao": ("Failed to load ",),
                 "torch.utils._pytree": ("%s is an Enum subclass and is now natively supported",)}


class DropMessages(logging.Filter):
    """A logging filter that drops the records whose message (its format string) starts with one of `prefixes`."""

    def __init__(self, prefixes):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record):
        return not str(record.msg).startswith(self.prefixes)


def silence_library_noise():
    """LIBRARY_NOISE's filters on their loggers, once (importing harness does it, before torch or transformers)."""
    for name, prefixes in LIBRARY_NOISE.items():
        if not any(isinstance(known, DropMessages) for known in logging.getLogger(name).filters):
            logging.getLogger(name).addFilter(DropMessages(prefixes))


silence_library_noise()
