"""What runs the lesson, beside it: a reader of the RL algorithm can skip this folder.

    config.py      every setting once (the Config dataclass), the command line generated from it, --resume's settings
    run.py         a run's lifecycle: the settings decided once, the policy built, metrics, evals, checkpoints, Ctrl-C
    prompts.py     the training prompts of each step: fresh draws, or --epochs over a fixed set
    checkpoint.py  the run's files, written atomically (a kill or a full disk never loses what was there)
    model.py       loading a policy: hub id, local folder, .gguf file, "smollm2", "tiny"
    tiny.py        the tiny offline model: character tokenizer, a small Llama, its CPU defaults and warm start

The lesson files (softmax_grpo, lopti, ppo, rollout, train's step functions) import nothing from here; train.py's
loop and `main` do. Nothing in this package imports torch at import time except run.py and tiny.py, so `--help` and
a bad flag answer before torch loads.
"""
