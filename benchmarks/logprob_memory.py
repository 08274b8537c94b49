"""Peak CPU memory of rollout.token_logprobs on a large vocabulary, by logit_chunk (Qwen2.5's 151 936 by default).

    python benchmarks/logprob_memory.py                       # 2 rows x 1024 completion tokens, chunks: all, 1024, 256
    python benchmarks/logprob_memory.py --rows 8 --chunks 0 4096 1024

A 1-layer Llama, 64 wide, with the full vocabulary: the logits dominate. Each measurement in a fresh
process: a no-grad scoring with entropy, a forward with backward. chunk 0: one a micro-batch.
"""
import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere


def rss_mib():
    with open("/proc/self/status") as f:  # Linux only
        fields = {line.split(":")[0]: int(line.split()[1]) for line in f if line.startswith(("VmHWM", "VmRSS"))}
    return fields["VmHWM"] / 1024, fields["VmRSS"] / 1024


def measure(args):
    import time

    from transformers import LlamaConfig, LlamaForCausalLM

    from rollout import token_logprobs
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    input_ids = torch.randint(0, args.vocab, (args.rows, args.prompt + args.tokens))
    attention_mask = torch.ones_like(input_ids)
    completion_mask = torch.ones(args.rows, args.tokens)
    chunk = args.chunk or args.rows * args.tokens
    _, before = rss_mib()
    start = time.perf_counter()
    if args.mode == "score":
        with torch.no_grad():
            token_logprobs(model, input_ids, attention_mask, completion_mask, logit_chunk=chunk,
                           with_entropy=True)
    else:
        logprobs = token_logprobs(model, input_ids, attention_mask, completion_mask,
                                  logit_chunk=chunk)
        logprobs.sum().backward()
    seconds = time.perf_counter() - start
    peak, _ = rss_mib()
    print(json.dumps({"peak_mib": peak - before, "seconds": seconds}))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--rows", type=int, default=2)
    p.add_argument("--tokens", type=int, default=1024, help="completion tokens per row")
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens per row")
    p.add_argument("--chunks", type=int, nargs="+", default=[0, 1024, 256])
    p.add_argument("--chunk", type=int, default=None, help=argparse.SUPPRESS)  # the subprocess's one measurement
    p.add_argument("--mode", choices=("score", "train"), default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.mode:
        return measure(args)
    one_copy = args.rows * args.tokens * args.vocab * 4 / 2**20
    print(f"vocab {args.vocab}, {args.rows} rows x {args.tokens} completion tokens: "
          f"one float32 copy of the logits = {one_copy:.0f} MiB")
    print(f"{'logit_chunk':>12s}{'no-grad + entropy':>20s}{'forward + backward':>20s}")
    for chunk in args.chunks:
        cells = []
        for mode in ("score", "train"):
            command = [sys.executable, os.path.abspath(__file__), "--mode", mode, "--chunk", str(chunk),
                       "--vocab", str(args.vocab), "--rows", str(args.rows), "--tokens", str(args.tokens),
                       "--prompt", str(args.prompt)]
            result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
            cells.append(f"{result['peak_mib']:8.0f} MiB {result['seconds']:5.1f}s")
        print(f"{chunk or 'all':>12}" + "".join(f"{c:>20s}" for c in cells))


if __name__ == "__main__":
    main()
