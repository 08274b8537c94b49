"""Device-free proxies of the decode step's cost: host ops, blocking syncs and ms per decode token
of plain generate and fast/decode_loop.py's loop on a "skinny" Qwen2 (all host cost); then the
loop's step's graph nodes per token and the bytes its attention writes per layer at Qwen2.5-0.5B's.

    python benchmarks/decode_ops.py                      # 24 layers (Qwen2.5-0.5B's), 16 rows
    python benchmarks/decode_ops.py --layers 2 --rows 4 --tokens 4 8   # a smoke test

The model: Qwen2.5-0.5B's layer structure at hidden 56, MLP 64, vocabulary 512 (the ops a token
dispatches depend on the structure, not the widths); no row finishes. "decode loop, one graph a
step" counts the step as one host op (a CUDA graph replay: inferred, not measured).
"""
import argparse
import os
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere
from fast import decode_loop as fast_loop, kv_cache  # noqa: E402

SYNC_OPS = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.unique",
            "aten._unique", "aten._unique2", "aten.unique_consecutive", "aten.unique_dim",
            "aten.multinomial", "aten.is_nonzero", "aten.item")
SAMPLING = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, repetition_penalty=1.0)


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched under it, its syncs, names, non-view ops (nodes) and, while
    `writes`, the bytes they write; nothing while `paused`."""

    def __init__(self):
        super().__init__()
        self.ops = self.syncs = self.nodes = self.written = 0
        self.names, self.paused, self.writes = set(), False, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket)
        if not self.paused:
            self.ops, self.syncs = self.ops + 1, self.syncs + (name in SYNC_OPS)
            self.names.add(name)
            self.nodes += not func.is_view
        if self.writes and not func.is_view:
            written = [args[3]] if name == "aten.index_copy_" else \
                [arg for arg, schema in zip(args, func._schema.arguments)
                 if schema.alias_info and schema.alias_info.is_write]
            self.written += sum(t.numel() * t.element_size() for t in written or (
                out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor))
        return out


def step_counts(model, rows, cache_length, prompt=32):
    ids = torch.randint(3, 500, (rows, prompt), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        prefilled = kv_cache.prefill(model, ids, mask)
        cache = kv_cache.static_cache(model, prefilled, rows, prompt, cache_length - prompt)
        step, _ = fast_loop.decode_step(model, cache, ids, mask, max_new_tokens=cache_length - prompt,
                                        pad_id=0, eos_id=-1, generate_kwargs=SAMPLING)
        step()  # the first step's lazy work out of the count
        counter = OpCounter()
        switch = [hook(lambda *a, on=on: setattr(counter, "writes", on)) for layer in model.model.layers
                  for hook, on in ((layer.self_attn.register_forward_pre_hook, True),
                                   (layer.self_attn.register_forward_hook, False))]
        with counter:
            step()
        for hook in switch:
            hook.remove()
    return counter.nodes, counter.written / len(model.model.layers)


def one_op(function, counter):
    def call(*args, **kwargs):
        counter.ops, counter.paused, was = counter.ops + (not counter.paused), True, counter.paused
        result = function(*args, **kwargs)
        counter.paused = was
        return result
    return call


def skinny_model(layers, seed=0, hidden=56):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    config = Qwen2Config(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=14,
                         num_key_value_heads=2, intermediate_size=64, vocab_size=512,
                         tie_word_embeddings=True, max_position_embeddings=4096, pad_token_id=0,
                         eos_token_id=1, bos_token_id=1)
    return Qwen2ForCausalLM(config).eval()


def paths(model, prompts, rows):
    ids = torch.randint(3, 500, (prompts, 32), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # some left padding
    ids, mask = (tensor.repeat_interleave(rows // prompts, 0) for tensor in (ids, mask))
    eos = model.config.vocab_size  # never sampled: every row runs its tokens
    options = dict(pad_id=0, eos_id=eos, generate_kwargs=SAMPLING)

    def plain(tokens, counter):  # rollout.py's generate call
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=tokens, pad_token_id=0,
                       eos_token_id=eos, **SAMPLING)

    def loop(tokens, counter, graph=False):
        step = fast_loop.decode_step

        def one_op_step(*args, **kwargs):
            run, state = step(*args, **kwargs)
            return one_op(run, counter), state
        if graph:
            fast_loop.decode_step = one_op_step
        model.__dict__.pop("_fast_generate_caches", None)  # a new step (the kept one: another path's)
        try:
            fast_loop.static_decode(model, ids, mask, max_new_tokens=tokens, **options,
                                    stop_check_every=fast_loop.STOP_CHECK_EVERY)
        finally:
            fast_loop.decode_step = step

    return {"plain generate": plain, "decode loop, eager": loop,
            "decode loop, one graph a step": lambda tokens, counter: loop(tokens, counter, True)}


def per_token(run, short, long):
    counts = []
    for tokens in (short, long):
        with OpCounter() as counter:
            run(tokens, counter)
        counts.append((counter.ops, counter.syncs))
    return tuple((b - a) / (long - short) for a, b in zip(*counts))


def ms_per_token(run, short, long, repeats):
    def seconds(tokens):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run(tokens, None)
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    return (seconds(long) - seconds(short)) / (long - short) * 1e3


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=24, help="Qwen2.5-0.5B: 24")
    p.add_argument("--rows", type=int, default=16, help="completions per call (prompts x M)")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--tokens", type=int, nargs=2, default=(8, 24), metavar=("SHORT", "LONG"))
    p.add_argument("--repeats", type=int, default=3, help="timed calls per length (median)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--stop-check-every", type=int, default=fast_loop.STOP_CHECK_EVERY)
    p.add_argument("--bytes-rows", type=int, default=128, help="rows of the attention's bytes")
    args = p.parse_args(argv)
    if args.rows % args.prompts:
        raise SystemExit(f"--rows {args.rows} is not a multiple of --prompts {args.prompts}")
    if not kv_cache.LAYERED_CACHE:
        raise SystemExit("the static cache needs transformers' layered cache API (4.57 or later)")
    torch.set_num_threads(args.threads)
    fast_loop.STOP_CHECK_EVERY = args.stop_check_every
    model = skinny_model(args.layers)
    short, long = args.tokens
    print(f"skinny Qwen2: {args.layers} layers, hidden 56, vocab 512, {args.rows} rows, sampled, "
          f"stop check every {args.stop_check_every}; per decode token from {short} vs {long} "
          f"tokens; CPU, {args.threads} thread(s), load {os.getloadavg()[0]:.1f}")
    print(f"{'path':44s} {'ops/token':>10s} {'syncs/token':>12s} {'ms/token':>9s}")
    results = {}
    with torch.no_grad():
        for name, run in paths(model, args.prompts, args.rows).items():
            ops, syncs = per_token(run, short, long)
            timed = "graph" not in name  # a proxy's time means nothing
            ms = ms_per_token(run, short, long, args.repeats) if timed else float("nan")
            results[name] = (ops, syncs, ms)
            print(f"{name:44s} {ops:10.1f} {syncs:12.3f} {ms:9.2f}", flush=True)
    after, plain = results["decode loop, one graph a step"][0], results["plain generate"][0]
    print(f"host ops per decode token: plain generate {plain:.0f}, the loop {after:.2f} (outside "
          f"the step + 1 replay, inferred as a graph's cost): {plain / after:.0f}x fewer")
    import transformers
    results["graph nodes"] = step_counts(model, args.rows, 320)[0]
    results["attention bytes"] = step_counts(skinny_model(1, hidden=896), args.bytes_rows, 320)[1]
    print(f"the decode loop's step under transformers {transformers.__version__}: "
          f"{results['graph nodes']} graph nodes (non-view ops) per decode token at {args.layers} "
          f"layers; its attention writes {results['attention bytes'] / 1e6:.1f} MB per layer and "
          f"step at Qwen2.5-0.5B's ({args.bytes_rows} rows, cache 320, bf16 autocast)")
    return results


if __name__ == "__main__":
    main()
