"""Export a LoRA run's checkpoint as one plain model: its adapters folded into the base weights.

    python -m harness.merge_lora runs/default/latest merged/    # then: AutoModelForCausalLM.from_pretrained("merged")

A LoRA checkpoint holds the adapters only; its run.json names the base (`initial_policy`). The
merged folder is an ordinary save_pretrained model with the run's tokenizer (no peft needed). A
--base-dtype nf4 run's adapters are folded into the base it trained on: each frozen linear quantized
to NF4 and back (the policy that ran).
"""
import argparse
import contextlib
import os
import sys

from harness.checkpoint import (LOCK, RESUME_NOTES, RUN_SETTINGS, holds_a_run, instead_of,
                                resolve_checkpoint, run_owns, verify_checkpoint)
from harness.files import RunError
from harness.flags import saved_config
from harness.manifest import save_policy_atomically, verify_manifest


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m harness.merge_lora", description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", help="a LoRA run's checkpoint-<step> folder, or its run folder (latest)")
    parser.add_argument("output", help="the folder to write the merged model into (must not exist)")
    args = parser.parse_args(argv)
    try:
        if os.path.lexists(args.output):  # before anything loads: nothing there is ever replaced
            raise RunError(f"{args.output} already exists; name a folder that does not exist yet")
        checkpoint = resolve_checkpoint(args.checkpoint, RESUME_NOTES.append)  # its note: once it passes its checks
        run_dir, out = os.path.dirname(checkpoint), os.path.join(os.path.realpath(os.path.dirname(
            os.path.abspath(args.output))), os.path.basename(os.path.abspath(args.output)))
        for folder in [run_dir] + run_folders_above(out):  # a run saves and prunes there: never beside them
            if os.path.commonpath([folder, out]) == folder:
                raise RunError(f"{args.output} is inside the run folder {folder}, where its run saves and prunes "
                               "checkpoints; name a folder outside it")
        settings = saved_config(checkpoint)  # run.json, validated
        if not settings.lora_rank:
            raise RunError(f"{checkpoint}: not a LoRA run (its weights are already a plain model)")
        if not settings.initial_policy:
            raise RunError(f"{checkpoint}/run.json: no initial_policy (the base weights the adapters belong to)")
        from harness.model import base_changed, load_adapters, load_policy, load_tokenizer, merge_adapters
        verify_manifest(checkpoint, instead_of(checkpoint), names=[RUN_SETTINGS])  # first
        changed = base_changed(settings, f"{checkpoint}/run.json")
        if changed:
            raise RunError(changed)
        if settings.initial_policy_sha256 is None:
            print(f"note: {checkpoint}/run.json records no sha256 of its base (a run from before the record, or a "
                  f"hub id): {settings.initial_policy} is taken as the base the adapters trained on")
        tokenizer = load_tokenizer(checkpoint)
        base, _ = load_policy(settings.initial_policy, tokenizer=tokenizer)
        if settings.base_dtype == "nf4":  # the base the policy ran with: quantized and dequantized again
            from harness.flags import require_library
            from harness.model import nf4_round_trip
            from harness.policy import storage_dtype
            require_library("torchao", "merging a --base-dtype nf4 run")
            base = nf4_round_trip(base.to(storage_dtype(settings)))
        adapted = load_adapters(base, checkpoint, settings)
        verify_checkpoint(checkpoint)  # its files the set its save wrote (manifest.json): last, as a resume does
        model = merge_adapters(adapted)
        save_policy_atomically(model, tokenizer, args.output)
    except (RunError, ValueError) as error:
        print(f"merge_lora: error: {error}", file=sys.stderr)
        sys.exit(1)
    print(f"merged {checkpoint} (adapters of rank {settings.lora_rank}) into {args.output}")


def run_folders_above(path):
    """The folders above path that hold a run (its lock, metrics.jsonl, latest or a checkpoint-<step>) where path
    lies under a name that run owns (a checkpoint-<step>, latest, ...: checkpoint.run_owns), which its next save
    or prune would replace or delete without a word."""
    folders, child = [], path
    while (folder := os.path.dirname(child)) != child:
        with contextlib.suppress(OSError):  # a folder this user may not list holds no run of theirs
            if run_owns(os.path.basename(child)) and (os.path.lexists(os.path.join(folder, LOCK))
                                                      or holds_a_run(folder)):
                folders.append(folder)
        child = folder
    return folders


if __name__ == "__main__":
    main()
