"""What runs the lesson, beside it: a reader of the RL algorithm can skip this folder.

    config.py      every setting once (the Config dataclass), the command line generated from it, --resume's settings
    run.py         a run's lifecycle: the settings decided once, the policy built, metrics, evals, checkpoints, Ctrl-C
    prompts.py     the training prompts of each step: fresh draws, or --epochs over a fixed set; their context check
    checkpoint.py  the run's files, written atomically (a kill or a full disk never loses what was there)
    metrics.py     metrics.jsonl: appended a row at a time, read a bounded line at a time, rewritten atomically
    model.py       loading a policy: hub id, local folder, .gguf file, "smollm2", "tiny"
    tiny.py        the tiny offline model: character tokenizer, a small Llama, its CPU defaults and warm start
    memory.py      the memory plan of --dry-run and --memory-budget: what a step holds, per card
    report.py      --report-to tensorboard,wandb: metrics.jsonl's rows and eval samples to a logger
    merge_lora.py  `python -m harness.merge_lora`: a LoRA run's adapters merged into a plain model folder
    watch.py       the notes on learning: a start, a fall, a flat run or a collapse, said in words
    step_page.py   --inspect-every's HTML page of one step (the command: experiments/inspect_step.py)
    before_torch.py  `python train.py`'s flags, read before torch loads (--help and a bad flag answer at once)

The lesson files (softmax_grpo, lopti, ppo, rollout, train's step functions collect_rollouts and update_policy)
import nothing from here (tests/test_train.py checks the step functions); train.py's loop and `main` do. config.py
and what it imports load no torch, so `--help` and a bad flag answer before torch loads.
"""
