"""The speed: the same numbers as the lesson's plain calls, in less time and memory.

rollout.py shows the plain HF `generate` call and the plain log-prob forward; each takes this
folder's path in one visible `if fast:` branch (train.update_policy is one update: its log-probs
fast/'s), the tests hold the two equal, `--no-fast` runs the lesson as written. A reader of the
algorithm can skip this folder.

  kv_cache.py   the KV cache in one place: the shared prompt prefill, the roomy cache (written in
                place, on by default), --fast-generate's static cache
  generate.py   generate's fast paths (roomy cache; --fast-generate's compiled fallback) and the
                self-check that holds them to plain generate at the first CUDA rollout
  decode_loop.py  --fast-generate's loop: a static-cache step with the sampling in, a CUDA graph
  logprobs.py   token_logprobs' fast path: shared-prompt forward, float32 head on tensor cores
  precision.py  --dtype's compute context (bf16 autocast), for the loop, the update's forwards and the
                step page

Nothing here imports rollout.py or train.py. Numbers: docs/performance.md.
"""
