"""--fast-generate, rollout.py's one opt-in: the same tokens as its plain generate call, one CUDA
graph a token on a GPU instead of eager generate's dispatched ops and a blocking read a token.

  decode_loop.py  the loop: generate's sampling loop on tensors written in place, its step captured
                  once per shape, the stop check every 8 tokens
  kv_cache.py     its static KV cache, in the compute dtype, kept on the model between calls
  generate.py     the entry: where the loop applies, its self-check on a CUDA device (graphs
                  against eager steps), the plain call wherever it does not hold

A reader of the algorithm can skip this folder; nothing here imports rollout.py or train.py.
Numbers: docs/performance.md.
"""
