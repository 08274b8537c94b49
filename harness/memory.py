"""The memory plan: what a run holds at its peak, estimated from the model's shape alone (no weights loaded).

    shape = model_shape(config.model)              # a hub id's or folder's config.json, a .gguf header, or tiny
    plan = memory_plan(shape, config, prompt_length)
    print(plan_text(plan))                         # --dry-run prints it; --memory-budget adds fitting_settings()

Every formula is here, once (docs/performance.md measures them against peak RSS). Assumed: no
[S, S] attention matrix, every completion to --max-new-tokens, --max-prompt-length or a guess.
"""
import dataclasses
import json
import math
import os
import re

from harness.config import parse_size

GB = 1e9
PROMPT_GUESS = {"compact": 16, "chat": 256}  # tokens, when --max-prompt-length does not say
# "Fits" keeps headroom: the plan's peak plus PLAN_ERROR of it (its CPU check errs by up to +-18%,
# docs/performance.md) plus, on CUDA, CUDA_CONTEXT (the context and cuBLAS workspaces, outside torch's allocator).
PLAN_ERROR = 0.20
CUDA_CONTEXT = 1e9
CACHE_BUCKET = 64  # fast/kv_cache.py's: --fast-generate's static cache is a multiple of this long


# ---------------------------------------------------------------------------------------------------------------
# The model's shape: from its config (hub id, folder, tiny) or its .gguf header; Qwen2.5's, written out
# ---------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A Llama/Qwen-style decoder: hidden H, MLP width I, layers L, query heads, KV heads, head_dim d, vocab V."""
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool          # the LM head is the embedding matrix
    qkv_bias: bool = False  # Qwen2's q, k, v projections have biases

    def __post_init__(self):
        """Every size a whole number within harness/model.py's CONFIG_SIZE_LIMITS, else a ValueError naming the
        config.json key before anything is computed (nothing ever "fits" on a negative, NaN, text or null size)."""
        from harness.model import CONFIG_SIZE_LIMITS
        for field, key in SHAPE_KEYS.items():
            value, limit = getattr(self, field), CONFIG_SIZE_LIMITS[key]
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
                raise ValueError(f"the model's {key} is {value!r}; the memory plan needs an integer from 1 to "
                                 f"{limit}")
        for field, key in (("tied", "tie_word_embeddings"), ("qkv_bias", "attention_bias")):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(f"the model's {key} is {getattr(self, field)!r}; the memory plan needs true or false")

    def linear_shapes(self):
        """{module name: (in, out)} of one layer's projections: LoRA's targets."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"q_proj": (self.hidden, q), "k_proj": (self.hidden, kv), "v_proj": (self.hidden, kv),
                "o_proj": (q, self.hidden), "gate_proj": (self.hidden, self.intermediate),
                "up_proj": (self.hidden, self.intermediate), "down_proj": (self.intermediate, self.hidden)}

    def parameters(self):
        """Parameter count: embedding (+ head when untied), per layer the 7 projections, biases and 2 norms."""
        per_layer = sum(i * o for i, o in self.linear_shapes().values()) + 2 * self.hidden \
            + (self.heads + 2 * self.kv_heads) * self.head_dim * self.qkv_bias
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.layers * per_layer + self.hidden

    def lora_parameters(self, rank, targets):
        """Adapter parameters: rank x (in + out) per targeted projection per layer."""
        shapes = self.linear_shapes()
        return self.layers * sum(rank * sum(shapes[name]) for name in targets.split(",") if name in shapes)

    def trained_parameters(self, config):
        """The parameters a run trains: LoRA's adapters (--lora-rank), else every one."""
        return self.lora_parameters(config.lora_rank, config.lora_targets) if config.lora_rank else self.parameters()


SHAPE_KEYS = {"hidden": "hidden_size", "intermediate": "intermediate_size", "layers": "num_hidden_layers",
              "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "head_dim": "head_dim",
              "vocab": "vocab_size"}  # ModelShape's field: its config.json key


def shape_from_config(config):
    """A transformers config (or any object with its field names) -> ModelShape (which checks every value; a
    missing or null one is named as such)."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    read = lambda key, default=None: getattr(config, key, default)  # noqa: E731
    heads, hidden = read("num_attention_heads"), read("hidden_size")
    whole = lambda value: isinstance(value, int) and not isinstance(value, bool) and value > 0  # noqa: E731
    qkv_bias = True if read("model_type", "") == "qwen2" else read("attention_bias", False)
    return ModelShape(hidden=hidden, intermediate=read("intermediate_size"), layers=read("num_hidden_layers"),
                      heads=heads, kv_heads=read("num_key_value_heads") or heads,
                      head_dim=read("head_dim") or (hidden // heads if whole(hidden) and whole(heads) else hidden),
                      vocab=read("vocab_size"), tied=read("tie_word_embeddings", False), qkv_bias=qkv_bias)


# Qwen2.5's config.json numbers (huggingface.co/Qwen/Qwen2.5-{size}/config.json), written out so that nothing downloads.
QWEN25 = {name: ModelShape(hidden=h, intermediate=i, layers=n, heads=q, kv_heads=kv, head_dim=h // q, vocab=151936,
                           tied=tied, qkv_bias=True)
          for name, (h, i, n, q, kv, tied) in {"qwen2.5-0.5b": (896, 4864, 24, 14, 2, True),
                                               "qwen2.5-1.5b": (1536, 8960, 28, 12, 2, True),
                                               "qwen2.5-3b": (2048, 11008, 36, 16, 2, True),
                                               "qwen2.5-7b": (3584, 18944, 28, 28, 4, False)}.items()}


# Qwen3-1.7B(-Base)'s (huggingface.co/Qwen/Qwen3-1.7B-Base/config.json; recipes/softmaxgrpo_qwen3_base.sh); its
# q_norm and k_norm weights (2 x 128 per layer) are left out: 7 168 of 1.7 billion.
QWEN3 = {"qwen3-1.7b": ModelShape(hidden=2048, intermediate=6144, layers=28, heads=16, kv_heads=8, head_dim=128,
                                  vocab=151936, tied=True)}


def gguf_shape(path):
    """ModelShape from a .gguf file's header (gguf's reader; the weights are not read)."""
    from gguf import GGUFReader
    reader = GGUFReader(path)
    value = lambda key: reader.fields[key].contents()  # noqa: E731
    arch = value("general.architecture")
    heads = value(f"{arch}.attention.head_count")
    names = {tensor.name for tensor in reader.tensors}
    hidden = value(f"{arch}.embedding_length")
    return ModelShape(hidden=hidden, intermediate=value(f"{arch}.feed_forward_length"),
                      layers=value(f"{arch}.block_count"), heads=heads,
                      kv_heads=value(f"{arch}.attention.head_count_kv") if f"{arch}.attention.head_count_kv"
                      in reader.fields else heads, head_dim=hidden // heads,
                      vocab=len(reader.fields["tokenizer.ggml.tokens"].data), tied="output.weight" not in names,
                      qkv_bias="blk.0.attn_q.bias" in names)


def model_shape(config):
    """The shape of config.model from its config alone: tiny's numbers, a Qwen2.5 hub id's (QWEN25), a .gguf
    header, a folder's config.json, or transformers' AutoConfig (the hub cache, or the hub when online). The
    written-out shapes (QWEN25, QWEN3) are matched by hub id, so the recipes plan offline."""
    from harness import model as model_files
    from harness import tiny
    known = re.fullmatch(r"qwen/(qwen2\.5-[\d.]+b|qwen3-[\d.]+b)(-instruct|-base)?", config.model.lower())
    if known and known.group(1) in {**QWEN25, **QWEN3}:
        return {**QWEN25, **QWEN3}[known.group(1)]
    if config.model == "tiny":
        return ModelShape(hidden=config.tiny_hidden, intermediate=(8 * config.tiny_hidden // 3 + 63) // 64 * 64,
                          layers=config.tiny_layers, heads=4, kv_heads=4, head_dim=config.tiny_hidden // 4,
                          vocab=len(tiny.build_char_tokenizer()), tied=True)  # tiny.build_tiny_model's numbers
    path, kwargs = model_files.model_source(config.model)
    if "gguf_file" in kwargs:
        return gguf_shape(os.path.join(path, kwargs["gguf_file"]))
    if os.path.isfile(os.path.join(path, "config.json")):
        with open(os.path.join(path, "config.json")) as f:
            return shape_from_config(_Fields(json.load(f)))
    from transformers import AutoConfig
    return shape_from_config(AutoConfig.from_pretrained(path, **kwargs))


class _Fields:
    """A config.json read as attributes (text_config first, for multimodal configs); a ValueError when it, or its
    text_config, is not a JSON object."""
    def __init__(self, fields):
        if not isinstance(fields, dict):
            raise ValueError(f"config.json is {type(fields).__name__}, not a JSON object")
        fields = fields.get("text_config", fields)
        if not isinstance(fields, dict):
            raise ValueError(f"config.json's text_config is {fields!r}; a JSON object of the model's sizes, or none")
        self.__dict__.update(fields)


# ---------------------------------------------------------------------------------------------------------------
# The plan: bytes of each part, the peak
# ---------------------------------------------------------------------------------------------------------------
def memory_plan(shape, config, prompt_length):
    """-> {part: bytes} of a run of config (its settled --dtype) on a model of `shape`, plus "peak" and what it
    assumed. Weights and gradients are in --param-dtype (bf16: plus the optimizer's fp32 masters), AdamW's moments
    fp32 (or 8-bit); activations and the KV cache are in the compute dtype, except the residual stream and RMSNorm,
    which stay fp32 under autocast (counted so under bf16 weights too: an overcount there)."""
    check_inputs(shape, config, prompt_length)
    compute = 2 if config.dtype == "bf16" else 4  # bytes per activation element
    P, T, M = prompt_length, config.max_new_tokens, config.num_generations
    rows = config.prompts_per_step * M
    generate_rows = min(config.rollout_batch or rows, rows) // M * M  # whole groups per generate call
    # the held-out eval's generate calls: at most EVAL_BATCH (or --rollout-batch) rows each
    eval_rows = min(config.eval_size, config.rollout_batch or EVAL_BATCH)
    micro = min(config.micro_batch, rows)
    trained = shape.trained_parameters(config)
    stored = 2 if config.param_dtype in ("bf16", "bf16-sr") else 4  # bytes per weight and per gradient
    lean = config.param_dtype == "bf16-sr" or config.step_in_backward  # harness/lean_optimizer.py's AdamW: no masters
    in_backward = config.step_in_backward  # each weight stepped in backward, its gradient freed: one at a time
    H, I, L = shape.hidden, shape.intermediate, shape.layers
    nf4 = config.base_dtype == "nf4" and config.lora_rank > 0  # the frozen linears in 4 bits (harness/model.py)
    projections = L * sum(i * o for i, o in shape.linear_shapes().values())  # what NF4 quantizes (not the head)
    weights = stored * (shape.parameters() - (projections if nf4 else 0) + (trained if config.lora_rank else 0)) \
        + (math.ceil(NF4_BYTES * projections) if nf4 else 0)
    offload = config.optimizer_offload and config.device.startswith("cuda")  # on a CPU there is one memory
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    # One decoder layer saves, per token: fp32 residual stream and the 2 RMSNorms' input and output (4H x 4 bytes),
    # under autocast the linears' bf16 copies of the 2 norm outputs; q, attention output, o_proj's input (3q),
    # k and v (2kv), the MLP's gate, SiLU, up and their product (4I), in the compute dtype.
    per_token_layer = 16 * H + (4 * H if compute == 2 else 0) + compute * (3 * q + 2 * kv + 4 * I)
    shared = not config.gradient_checkpointing and micro > 1 and P > 1  # rollout.completion_hidden_states
    if not shared:  # the plain forward: every row's P + T tokens (checkpointed: each layer keeps its input)
        tokens = micro * (P + T)
        layer_activations = 4 * H * tokens * L + per_token_layer * tokens if config.gradient_checkpointing \
            else L * per_token_layer * tokens  # checkpointed: + one layer recomputed in backward
    else:  # shared prompts: each distinct prompt's P tokens once, every row's T, each row's K, V over P + T
        tokens = math.ceil(micro / M) * P + micro * T
        layer_activations = L * (per_token_layer * tokens + compute * 2 * kv * micro * P)
    # GQA: transformers' repeat_kv copies K and V to every query head, and SDPA saves the copies (measured)
    gqa_copies = compute * 2 * (q - kv) * micro * (P + T) * (1 if config.gradient_checkpointing else L)
    # one layer's backward on top: its MLP's 2 [tokens, I] input gradients, the residual's 2 [tokens, H]
    backward = (2 * compute * I + 2 * stored * H) * tokens
    # the tokens whose float32 logits, scaling and softmax exist at once (rollout.token_logprobs): "logit_chunk"
    at_once = min(config.logit_chunk, micro * T)
    autocast_copies = 2 * trained if compute == 2 and not config.lora_rank and stored == 4 else 0  # bf16 casts of
    # the fp32 trained weights; bf16 weights: the float32 head's copy of the [V, H] head (rollout.token_logprobs)
    head_copy = 4 * shape.vocab * H if stored == 2 else 0
    masters = 4 * trained if config.param_dtype == "bf16" or offload else 0  # the optimizer's fp32 copies
    # (master_weights.py; bf16-sr and --step-in-backward keep none)
    moments = int((2 * (1 + 4 / 256) if config.optimizer == "adamw8bit" else 8) * trained)  # AdamW's moments:
    # fp32, or 8-bit codes with a float32 scale per block of 256 (torchao: tensors of >= 4096 weights)
    # --fast-generate keeps its static cache and CUDA graphs' pool (autocast's bf16 weight copies,
    # 4 float32 [rows, V]) on the model between calls (fast/decode_loop.py), so through the update
    fast, cuda, rows_kv = config.fast_generate, config.device.startswith("cuda"), \
        compute * 2 * L * kv * max(generate_rows, eval_rows)  # a position's K and V, all rows
    plan = {
        "weights": weights,
        "gradients": stored * (largest_gradient(shape, config) if in_backward else trained),
        "master_weights": 0 if offload else masters,
        "optimizer": 0 if offload else moments,
        "reference": stored * shape.parameters() if config.kl_coef > 0 and not config.lora_rank else 0,
        "kv_cache": rows_kv * (P + T) * (not fast),
        "static_cache": rows_kv * -(-(P + T) // CACHE_BUCKET) * CACHE_BUCKET * fast,
        "graph_pool": (autocast_copies + 16 * shape.vocab * generate_rows) if fast and cuda else 0,
        "sampling_logits": 3 * 4 * shape.vocab * max(generate_rows, eval_rows),  # float32 logits, scaled, softmax of one token
        "activations": layer_activations + gqa_copies + 8 * H * tokens + autocast_copies + head_copy,  # + the
        # final norm's input and output
        "backward": backward,
        # NF4: each forward (and backward) dequantizes one frozen linear at a time to --param-dtype; the largest is
        # an MLP matrix (autograd saves the NF4 tensor, not the copy). Counted in both phases.
        "nf4_dequantized": stored * H * I if nf4 else 0,
        "logit_chunk": 3 * 4 * shape.vocab * at_once,
        # the LM head's and the embedding's fp32 [V, H] gradients, each made whole in backward before .grad += it
        "head_gradients": 0 if config.lora_rank else 2 * stored * shape.vocab * H,
        # foreach AdamW's temporary on CUDA; bf16 weights: one tensor at a time (master_weights.py), its fp32
        # gradient and temporary, the largest being the [V, H] embedding (LoRA: its adapters are in bf16 too)
        # LeanAdamW (bf16-sr, --step-in-backward): one tensor at a time, LEAN_STEP_BYTES per element of a chunk
        "optimizer_step": LEAN_STEP_BYTES * min(LEAN_CHUNK, trained if config.lora_rank else shape.vocab * H) if lean
        else (4 * trained if config.device.startswith("cuda") else 0) if stored == 4 and not offload
        else (4 if offload else 8 if config.device.startswith("cuda") else 4) * (trained if config.lora_rank
                                                                                 else shape.vocab * H),
        # --optimizer-offload on CUDA: the new weight's fp32 copy on the card as copy_ converts it, one at a time
        "offloaded": masters + moments if offload else 0,  # in CPU memory, not in the peak
    }
    # a checkpoint: the weights as stored (LoRA: its adapters; a tied head once), masters, moments
    checkpoint = stored * (trained if config.lora_rank else shape.parameters()) + masters + moments
    held = sum(plan[name] for name in HELD)
    # gradients live from the first backward to the next zero_grad: in the step, the later
    # micro-batches' forward and (fp32 in place only) the rollout; --step-in-backward: one at a
    # time, on top of the backward's peak
    micro_batches = math.ceil(math.ceil(rows / config.mini_batches) / micro)  # per mini-batch
    grads_in_forward = plan["gradients"] if micro_batches > 1 and not in_backward else 0
    grads_in_rollout = plan["gradients"] if stored == 4 and not offload and not lean else 0
    stepped_in_backward = plan["gradients"] + plan["optimizer_step"] if in_backward else 0
    # what every phase holds (the gradients are counted per phase here)
    always = held - plan["gradients"] + plan["static_cache"] + plan["graph_pool"]
    plan["rollout_peak"] = always + grads_in_rollout + plan["kv_cache"] + plan["sampling_logits"] \
        + plan["nf4_dequantized"]
    plan["update_peak"] = always + max(grads_in_forward + plan["activations"] + plan["backward"] + plan["logit_chunk"]
                                       + plan["head_gradients"] + plan["nf4_dequantized"] + stepped_in_backward,
                                       plan["gradients"] + plan["optimizer_step"])
    plan["peak"] = max(plan["rollout_peak"], plan["update_peak"])
    plan["assumed"] = dict(prompt_length=P, completion_length=T, rows=rows, generate_rows=generate_rows,
                           eval_rows=eval_rows, head_tokens_at_once=at_once,
                           micro_batch=micro, trained_parameters=trained, parameters=shape.parameters(),
                           device=config.device, compute_dtype="bf16" if compute == 2 else "fp32",
                           kl_coef=config.kl_coef, checkpoint=checkpoint,
                           keep=config.keep_checkpoints,
                           weights_dtype=config.param_dtype + (", NF4 base" if nf4 else "")
                           + (", stepped in backward" if in_backward else ""))
    return plan


LEAN_CHUNK = 2**20  # harness/lean_optimizer.py's CHUNK: elements stepped at once
LEAN_STEP_BYTES = 64  # its temporaries per element of a chunk: the fp32 weight, gradient, moments and denominator
# (4 bytes each), the 8-bit moments' requantization (int64 codes and their search, ~40 bytes) the most


def largest_gradient(shape, config):
    """Elements of the largest gradient --step-in-backward holds at once outside head_gradients: LoRA's largest
    adapter matrix; full-parameter, a decoder layer's largest projection (the [V, H] embedding and head gradients
    are head_gradients' buffers, which backward holds anyway)."""
    linears = shape.linear_shapes()
    if config.lora_rank:
        return max(config.lora_rank * max(linears[name]) for name in config.lora_targets.split(",")
                   if name in linears) if any(name in linears for name in config.lora_targets.split(",")) else 0
    return max(i * o for i, o in linears.values())


EVAL_BATCH = 256  # rollout.evaluate's batch_size: rows per greedy generate call of the held-out eval
PLAN_LIMIT = 2**24  # the largest count (rows, tokens, rank) a plan takes: far above any card's run


def check_inputs(shape, config, prompt_length):
    """What memory_plan reads, checked in one place before it computes: a ValueError naming the setting (its flag)
    for a value of the wrong type or range, whatever built the Config (the command line, run.json, Python)."""
    if not isinstance(shape, ModelShape):
        raise ValueError(f"memory plan: the model's shape is {type(shape).__name__}, not a ModelShape")
    counts = {"prompts_per_step": 1, "num_generations": 1, "max_new_tokens": 1, "micro_batch": 1, "logit_chunk": 1,
              "lora_rank": 0, "eval_size": 1, "rollout_batch": 1}
    for name, low in {**counts, "prompt_length": 1}.items():
        value = prompt_length if name == "prompt_length" else getattr(config, name, None)
        if name == "rollout_batch" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= PLAN_LIMIT:
            flag = "the prompt length" if name == "prompt_length" else "--" + name.replace("_", "-")
            raise ValueError(f"memory plan: {flag} is {value!r}; it needs an integer from {low} to {PLAN_LIMIT}")
    kl = getattr(config, "kl_coef", None)
    if isinstance(kl, bool) or not isinstance(kl, (int, float)) or not math.isfinite(kl) or kl < 0:
        raise ValueError(f"memory plan: --kl-coef is {kl!r}; it needs a finite number >= 0")
    for name, allowed in {"dtype": ("fp32", "bf16"), "param_dtype": ("fp32", "bf16", "bf16-sr"),
                          "optimizer": ("adamw", "adamw8bit"), "base_dtype": (None, "nf4"),
                          "gradient_checkpointing": (True, False), "optimizer_offload": (True, False),
                          "step_in_backward": (True, False)}.items():
        value = getattr(config, name, None)
        if not any(value is choice or (isinstance(choice, str) and value == choice) for choice in allowed):
            raise ValueError(f"memory plan: --{name.replace('_', '-')} is {value!r}; it needs one of "
                             f"{', '.join(map(str, allowed))}")
    if not isinstance(config.device, str) or not isinstance(config.lora_targets, str):
        raise ValueError(f"memory plan: --device and --lora-targets need text, got {config.device!r} and "
                         f"{config.lora_targets!r}")


def needed(plan):
    """Bytes a card must have for `plan`: its peak, PLAN_ERROR more, and on CUDA the context (CUDA_CONTEXT)."""
    return plan["peak"] * (1 + PLAN_ERROR) + (CUDA_CONTEXT if plan["assumed"]["device"].startswith("cuda") else 0)


def headroom_text(device):
    """The margin "fits" keeps, in words."""
    return f"peak + {PLAN_ERROR:.0%} for the plan's error" + (f" + {CUDA_CONTEXT / GB:.0f} GB for the CUDA context"
                                                              if device.startswith("cuda") else "")


HELD = ("weights", "gradients", "master_weights", "optimizer", "reference")  # held all the time, whatever the batch
PARTS = ("weights", "gradients", "master_weights", "optimizer", "reference", "static_cache",
         "graph_pool", "kv_cache", "sampling_logits", "activations", "backward", "nf4_dequantized",
         "logit_chunk", "head_gradients", "optimizer_step")
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)  # torchao's NF4: 4 bits a weight, an int8 scale per 64, a float32 per 256
# scales (harness/model.py's NF4_BLOCK, NF4_SCALER_BLOCK; measured: 0.5158 bytes a weight of a 896 x 896 matrix)


# What fitting_settings may change, cheapest first, and what each costs (fit_text prints one line per choice made).
OPTIONS = {  # name: (the settings it changes, its cost)
    "micro_batch": ({}, "time: more, smaller forward/backward calls; the same update (except under "
                        "--loss-agg token-mean-per-micro-batch, whose token means are per micro-batch)"),
    "rollout_batch": ({}, "time: more, smaller generate calls; the same samples' distribution"),
    "gradient_checkpointing": ({"gradient_checkpointing": True},
                               "time: each layer's forward again in backward (~+1/3 of the update) and no shared-"
                               "prompt forward; the same update to float rounding"),
    "param_dtype": ({"param_dtype": "bf16", "dtype": "bf16"},
                    "precision: every weight rounded to bf16 after each step (fp32 masters keep the update), bf16 "
                    "compute; docs/performance.md measures the ratio's noise and the learning"),
    "optimizer": ({"optimizer": "adamw8bit"}, "precision: AdamW's moments in 8 bits (torchao: pip install torchao; "
                                              "on fp32 masters its AdamW8bit, compiled: minutes at the first step)"),
    "optimizer_offload": ({"optimizer_offload": True}, "time: every gradient to CPU memory and every weight back "
                          "over PCIe each step, AdamW stepped by the CPU (seconds a step at billions of weights); "
                          "the same update; CPU memory holds the fp32 masters and moments (the plan's 'offloaded')"),
    "stochastic_rounding": ({"param_dtype": "bf16-sr", "dtype": "bf16"},
                            "precision: bf16 weights with no fp32 masters (4 bytes a weight fewer), each step's new "
                            "weight stochastically rounded to bf16: unbiased, so steps below half a bf16 spacing are "
                            "kept on average, but each weight walks ~1 spacing a step around the fp32 path "
                            "(harness/lean_optimizer.py); bf16 compute"),
    "step_in_backward": ({"step_in_backward": True, "grad_clip": 0.0},
                         "what is learned: each weight stepped in backward, its gradient freed (one at a time), so "
                         "every micro-batch is an optimizer step: --mini-batches rows/micro-batch steps a batch, "
                         "not one (the later ones on samples off the policy, where the ratio clip acts; the same "
                         "update only where one micro-batch made the step already), and no global gradient clip "
                         "(--grad-clip 0); time: the same backward, and an AdamW pass over every weight per "
                         "micro-batch (mini-batches of them a batch, not one), plus a pi_old forward when steps > 1"),
    "lora_rank": ({"lora_rank": 16}, "what is learned: a rank-16 update of the projections, not every weight"),
    "base_dtype": ({"base_dtype": "nf4"}, "precision: LoRA's frozen base in 4-bit NF4 (QLoRA; torchao), the policy "
                                          "and its reference both that base, not the model's own weights; time: "
                                          "each linear dequantized in every forward"),
    "kl_coef": ({"kl_coef": 0.0}, "what is learned: another objective, no k3 KL term to the initial policy (drops "
                                  "the reference copy); tried only where the caller allows it (allowed=... 'kl_coef')"),
}
NOT_AVAILABLE = "not tried: --kl-coef 0 (drops the reference copy: another objective, so only when asked; " \
    "benchmarks/memory_check.py --targets tries it)"
STEPS = ("gradient_checkpointing", "param_dtype", "optimizer", "optimizer_offload", "stochastic_rounding",
         "step_in_backward", "lora_rank", "base_dtype")  # the memory switches, in OPTIONS' order
OBJECTIVE_STEPS = ("kl_coef",)  # switches that change the objective: tried only when `allowed` names them
# Why: offload (same update) before bf16-sr (a random walk costs more than masters' rounding);
# step-in-backward before LoRA (a rank-16 subspace); a combination config.py refuses is never tried
# (consistent)


def consistent(config, combo):
    """Whether the settings of `combo` on top of config are a combination harness/config.py accepts: bf16-sr and
    bf16 masters are one setting; --optimizer-offload steps fp32 masters, so neither bf16-sr nor
    --step-in-backward with it; --step-in-backward not on bf16 masters; --logprob-fp32 only on fp32 weights."""
    level = {k: v for name in combo for k, v in OPTIONS[name][0].items()}
    get = lambda key: level.get(key, getattr(config, key))  # noqa: E731
    return not ("param_dtype" in combo and "stochastic_rounding" in combo) and \
        not (get("optimizer_offload") and (get("param_dtype") == "bf16-sr" or get("step_in_backward"))) and \
        not (get("step_in_backward") and get("param_dtype") == "bf16") and \
        not (get("logprob_fp32") and get("param_dtype") != "fp32")


def option_levels(config, allowed):
    """Every combination of the switches (STEPS) not already on and in `allowed`, cheapest first: by the costliest
    switch it uses, then by how many."""
    order = STEPS + OBJECTIVE_STEPS
    free = [name for name in order if name in allowed and not all(getattr(config, k) == v for k, v in
                                                                  OPTIONS[name][0].items())]
    combos = [[name for bit, name in enumerate(free) if mask >> bit & 1] for mask in range(2 ** len(free))]
    combos = [combo for combo in combos if ("base_dtype" not in combo or config.lora_rank or "lora_rank" in combo)
              and consistent(config, combo)]
    return sorted(combos, key=lambda combo: (max((order.index(n) for n in combo), default=-1), len(combo)))


def fitting_settings(shape, config, prompt_length, budget, *, allowed=STEPS):
    """The least costly change of the memory settings whose plan fits `budget` bytes with headroom (needed) ->
    (changes dict, plan), or (None, the smallest plan tried). Tried in OPTIONS' order of cost: the switches'
    combinations (option_levels; `allowed` limits them, e.g. no LoRA; OBJECTIVE_STEPS only when named), and within
    each, smaller micro-batches and rollout batches, largest first. With --step-in-backward (asked or chosen), each
    micro-batch makes an optimizer step: --mini-batches rises to rows / micro-batch (config.py's rule)."""
    check_inputs(shape, config, prompt_length)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget < math.inf:
        raise ValueError(f"memory plan: the budget is {budget!r}; it needs a number of bytes > 0")
    rows = config.prompts_per_step * config.num_generations
    micro_batches = sorted({m for m in (config.micro_batch, 16, 8, 4, 2, 1) if m <= config.micro_batch}, reverse=True)
    rollout_batches = sorted({r for r in (config.rollout_batch or rows, 256, 128, 64, 32, 16)
                              if config.num_generations <= r <= (config.rollout_batch or rows)}, reverse=True)
    smallest = None
    for combo in option_levels(config, allowed):
        level = {k: v for name in combo for k, v in OPTIONS[name][0].items()}
        for micro in micro_batches:
            for rollout in rollout_batches:
                changes = {**level, "micro_batch": micro, "rollout_batch": rollout}
                if level.get("step_in_backward", config.step_in_backward):  # one micro-batch per optimizer step
                    changes["mini_batches"] = max(config.mini_batches, math.ceil(rows / micro))
                changes = {k: v for k, v in changes.items() if getattr(config, k) != v and
                           not (k == "rollout_batch" and v == rows and config.rollout_batch is None)}
                plan = memory_plan(shape, dataclasses.replace(config, **changes), prompt_length)
                if needed(plan) <= budget:
                    return changes, plan
                smallest = plan if smallest is None or plan["peak"] < smallest["peak"] else smallest
    return None, smallest


FULL_ONLY = tuple(name for name in STEPS if name not in ("lora_rank", "base_dtype"))  # --memory-fit full
ON_CARD = tuple(name for name in FULL_ONLY if name != "optimizer_offload")


def mode_fits(shape, config, prompt_length, budget):
    """Per mode, whether and how the run fits `budget` (each searched alone by fitting_settings) -> [(mode, (changes,
    plan))]: full-parameter with everything on the card; full-parameter with AdamW's states offloaded to CPU memory;
    with a KL term, full-parameter on the card without it (--kl-coef 0: another objective); and LoRA rank 16 (its
    4-bit base allowed) unless --memory-fit full. A LoRA run (--lora-rank given) has one mode: as asked."""
    if config.lora_rank:
        return [(f"LoRA rank {config.lora_rank}", fitting_settings(shape, config, prompt_length, budget))]
    modes = [("full-parameter, all on the card", fitting_settings(shape, config, prompt_length, budget,
                                                                 allowed=ON_CARD)),
             ("full-parameter, AdamW's states offloaded", fitting_settings(shape, config, prompt_length, budget,
                                                                          allowed=FULL_ONLY))]
    if config.kl_coef > 0:
        modes.append(("full-parameter, all on the card, --kl-coef 0 (another objective)", fitting_settings(
            shape, config, prompt_length, budget, allowed=ON_CARD + OBJECTIVE_STEPS)))
    if config.memory_fit == "any":
        changes, fitted = fitting_settings(shape, dataclasses.replace(config, lora_rank=16), prompt_length, budget,
                                           allowed=tuple(name for name in STEPS if name != "lora_rank"))
        modes.append(("LoRA rank 16", ({"lora_rank": 16, **changes} if changes is not None else None, fitted)))
    return modes


def modes_text(modes, budget):
    """mode_fits' answer, one line a mode."""
    def said(changes, fitted):
        if changes is None:
            return f"does not fit (the smallest plan tried needs {needed(fitted) / GB:.3f} GB)"
        steps = f"; {changes['mini_batches']} optimizer steps a batch" if changes.get("step_in_backward") else ""
        return "fits as it is" if not changes else f"fits with {flags_text(changes)}" \
            + f" (peak {fitted['peak'] / GB:.3f} GB, needs {needed(fitted) / GB:.3f}{steps})" + never_on_gpu(changes)
    return f"  per mode, on {budget / GB:.1f} GB (each searched alone):" + "".join(
        f"\n    {mode}: {said(*fit)}" for mode, fit in modes)


# ---------------------------------------------------------------------------------------------------------------
# The step's time on a card: estimated per phase from its floor and the one GPU log's host time, never measured
# ---------------------------------------------------------------------------------------------------------------
GPU_PEAKS = {  # dense (no sparsity) tensor-core peaks from the vendors' datasheets: FLOP/s by dtype, bytes/s
    "H200": dict(bf16=989e12, fp16=989e12, fp32=67e12, bandwidth=4.8e12),
    "H100": dict(bf16=989e12, fp16=989e12, fp32=67e12, bandwidth=3.35e12),  # SXM
    "A100": dict(bf16=312e12, fp16=312e12, fp32=19.5e12, bandwidth=2.039e12),  # 80 GB SXM
    "L4": dict(bf16=121e12, fp16=121e12, fp32=30.3e12, bandwidth=0.3e12),
    "RTX 4090": dict(bf16=165e12, fp16=165e12, fp32=82.6e12, bandwidth=1.008e12),  # bf16 with fp32 accumulate
}  # (benchmarks/floor.py's KNOWN_GPUS: the floor of each phase)
EFFICIENCY = 0.4  # the share of a card's datasheet peaks its kernels reach: a guess, a round figure
# Host seconds at 24 layers per generate call, decode token, micro-batch and optimizer step, fitted
# to the one GPU log (H200, 16 prompts x 8 x 256, micro-batch 16; head in IEEE fp32: an upper bound)
HOST, HOST_SOURCE = dict(prefill=0.304, decode=5.0 / 256, update=2.016 / 8, optimizer=0.0132), \
    "lab/logs/gpu-h200-27cee0c/r2-concat.txt"
FAST_DECODE = 3.1e-3  # --fast-generate's 24-layer decode token: a guess (~1 200 kernels, 2.5 us)
CPU_ADAMW, PCIE = 10e9, 25e9  # --optimizer-offload: bytes/s of a CPU's AdamW and of the card's link (typed)
# The settings no GPU has finished a step with (lab/logs/gpu-h200-27cee0c ran the default step
# alone)
NEVER_ON_GPU = ("gradient_checkpointing", "param_dtype", "optimizer", "optimizer_offload", "stochastic_rounding",
                "step_in_backward", "lora_rank", "base_dtype", "fast_generate")


def step_phases(shape, config, prompt_length, peaks):
    """{phase: (device s, host s)} of one step on a card of `peaks` (a GPU_PEAKS row), which takes the larger of each:
    the floor (benchmarks/floor.py's count, uniform rows) at EFFICIENCY, and HOST x layers / 24. The update's work:
    x2 Lopti, x --ppo-epochs, x4/3 --gradient-checkpointing, x2/3 LoRA, +1/3 --kl-coef (docs/performance.md)."""
    P, T, M, G = prompt_length, config.max_new_tokens, config.num_generations, config.prompts_per_step
    b = 2 if config.dtype == "bf16" else 4
    flops_peak, bandwidth = peaks[config.dtype] * EFFICIENCY, peaks["bandwidth"] * EFFICIENCY
    body = shape.layers * sum(i * o for i, o in shape.linear_shapes().values())
    weights = body + shape.vocab * shape.hidden  # the LM head runs whether or not it is tied
    kv_bytes = 2 * shape.layers * shape.kv_heads * shape.head_dim * b  # one position's keys and values
    attention = lambda keys: 4 * shape.layers * shape.heads * shape.head_dim * keys  # noqa: E731
    causal = lambda n, first: n * first + n * (n - 1) // 2  # noqa: E731  (query, key) pairs
    floor = lambda flops, moved: max(flops / flops_peak, moved / bandwidth)  # noqa: E731
    split = lambda rows, size: [min(size, rows - start) for start in range(0, rows, size)]  # noqa: E731
    rows, scale = G * M, shape.layers / 24
    calls, chunks = split(rows, config.rollout_batch or rows), split(rows, min(config.micro_batch, rows))
    prefill = sum(floor(n * (2 * body * (P - 1) + attention(causal(P - 1, 1))),
                        body * b + n * (P - 1) * kv_bytes) for n in calls)  # every row its prompt
    decode = sum(floor(2 * weights * n + attention(n * (P + t)), weights * b + n * (P + t) * kv_bytes)
                 for n in calls for t in range(T))
    head = 2 if config.dtype in ("bf16", "fp16") else 1  # the head on TF32: half the 16-bit rate (floor.HEAD_COST)
    forward = sum(-(-n // M) * (2 * body * (P - 1) + attention(causal(P - 1, 1)))  # a prompt once
                  + n * (2 * (body + head * shape.vocab * shape.hidden) * T + attention(causal(T, P)))
                  for n in chunks)
    passes = config.ppo_epochs * (2 if config.lopti_eta > 0 else 1)
    work = passes * (4 / 3 if config.gradient_checkpointing else 1) * (2 / 3 if config.lora_rank else 1) \
        + (1 / 3 if config.kl_coef > 0 else 0)
    trained = shape.trained_parameters(config)
    steps = passes * config.mini_batches
    offload = trained * (28 / CPU_ADAMW + 6 / PCIE) if config.optimizer_offload else 0  # fp32 grads out, bf16 back
    return {"prefill": (prefill, HOST["prefill"] * len(calls) * scale),
            "decode": (decode, (FAST_DECODE if config.fast_generate else HOST["decode"]) * T
                       * len(calls) * scale),
            "update": (work * floor(3 * forward, 3 * len(chunks) * weights * b),
                       HOST["update"] * work * len(chunks) * scale),
            "optimizer": (0 if offload else steps * 28 * trained / bandwidth,
                          offload or steps * HOST["optimizer"] * scale)}


def step_time_text(shape, config, prompt_length, what="at this run's settings", caption=True):
    """One line: step_phases' step (each phase's larger time, summed) and steps an hour on each card of GPU_PEAKS."""
    def card(name, peaks):
        phases = step_phases(shape, config, prompt_length, peaks)
        seconds, bound = sum(map(max, phases.values())), ", ".join(p for p, (d, h) in phases.items() if d > h)
        return f"{name} ~{seconds:.3g} s ({3600 / seconds:.0f} an hour{'; device-bound: ' + bound if bound else ''})"
    loop = "--fast-generate's decode token a guess (no GPU has run it), " if config.fast_generate \
        else ""
    return f"  step time {what}" + (
        " (estimated per phase, the larger of its device time, the floor at a guessed"
        f" {EFFICIENCY:.0%} of the datasheet peaks, and its host time per generate call, decode"
        " token, micro-batch and"
        f" optimizer step fitted to one H200 log ({HOST_SOURCE}) x layers / 24; {loop}every row to"
        " --max-new-tokens, no held-out eval; not measured at this shape)" if caption else "") \
        + ": " + ", ".join(card(*item) for item in GPU_PEAKS.items())


def never_on_gpu(changes):
    """The flags of `changes` (a config's or a fit's settings) that no GPU has run a step with, in words, or ""."""
    names = [name for name in NEVER_ON_GPU if name == "fast_generate" and changes.get(name) or
             name in OPTIONS and chosen(name, changes)]
    flags = sorted({"--fast-generate" if name == "fast_generate" else flags_text(
        {k: v for k, v in changes.items() if k in OPTIONS[name][0] or k == name}) for name in names})
    return f" [never run on a GPU: {', '.join(flags)}]" if flags else ""


def plan_text(plan, budget=None, fit=None):
    """The plan as lines of text: what it assumed (device, dtypes), each part in GB, the two phases' peaks, and (with
    a budget) what fits, keeping the headroom of needed()."""
    a = plan["assumed"]
    lines = [f"memory plan for {a['device']}, {a['weights_dtype']} weights, {a['compute_dtype']} compute "
             f"(estimated; docs/performance.md): {a['parameters'] / 1e6:.1f}M parameters, "
             f"{a['trained_parameters'] / 1e6:.2f}M trained; {a['rows']} rows of {a['prompt_length']} prompt + "
             f"{a['completion_length']} completion tokens, {a['generate_rows']} per generate call ({a['eval_rows']} "
             f"in the held-out eval's), "
             f"{a['micro_batch']} per micro-batch"]
    lines += [f"  {name.replace('_', ' '):<16s}{plan[name] / GB:9.3f} GB" for name in PARTS if plan[name]]
    if plan["offloaded"]:
        lines.append(f"  (in CPU memory, not in the peak: {plan['offloaded'] / GB:.3f} GB of fp32 master weights and "
                     "AdamW's moments, --optimizer-offload)")
    lines.append(f"  peak: {plan['peak'] / GB:.3f} GB (rollout phase {plan['rollout_peak'] / GB:.3f}, "
                 f"update phase {plan['update_peak'] / GB:.3f}); needs {needed(plan) / GB:.3f} GB "
                 f"({headroom_text(a['device'])})")
    copies = f"up to {a['keep'] + 1} while one saves (--keep-checkpoints {a['keep']})" \
        if a["keep"] else "all kept"
    lines.append(f"  a checkpoint on disk: {a['checkpoint'] / GB:.3f} GB (weights, masters, "
                 f"moments), {copies}")
    if budget is not None:
        lines.append(f"  budget {budget / GB:.1f} GB, fits when {headroom_text(a['device'])} <= budget: "
                     + fit_text(plan, budget, fit))
    return "\n".join(lines)


def flags_text(changes):
    """{"lora_rank": 16, "gradient_checkpointing": True} -> "--gradient-checkpointing --lora-rank 16"."""
    return " ".join(f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in sorted(changes.items()))


def chosen(name, changes):
    """Whether OPTIONS[name] is among `changes`: its first setting at its value (micro_batch, rollout_batch: named)."""
    settings = OPTIONS[name][0]
    key = next(iter(settings), name)
    return key in changes and (not settings or changes[key] == settings[key])


def fit_text(plan, budget, fit, *, kl_tried=False):
    """fitting_settings' answer in words: as it is, with which flags, or by how much the smallest plan tried misses
    (and, when the weights alone are over the budget, that fewer rows or tokens cannot help). kl_tried: the search
    was allowed --kl-coef 0, so the note that it was not is left out."""
    changes, fitted = fit
    kl_tried = kl_tried or not plan["assumed"]["kl_coef"]  # --kl-coef 0 given: nothing left untried
    untried = "" if kl_tried else f"\n    ({NOT_AVAILABLE})"
    if changes == {}:
        return f"fits as it is (needs {needed(plan) / GB:.3f} GB)"
    if changes is not None:
        own = lambda name, k: k in OPTIONS[name][0] or k == name or (  # noqa: E731 (the flags an option set)
            k == "mini_batches" and name == "step_in_backward")
        costs = [f"\n    {flags_text({k: v for k, v in changes.items() if own(name, k)})}: {cost}"
                 + (" [never run on a GPU]" if name in NEVER_ON_GPU else "")
                 for name, (_, cost) in OPTIONS.items() if chosen(name, changes)]
        return f"fits with {flags_text(changes)} (peak {fitted['peak'] / GB:.3f} GB, needs {needed(fitted) / GB:.3f})" \
            + "".join(costs) + untried
    text = f"does not fit{'' if kl_tried else f' ({NOT_AVAILABLE})'}: the smallest plan tried needs " \
        f"{needed(fitted) / GB:.3f} GB, " \
        f"{(needed(fitted) - budget) / GB:.3f} GB over"
    held = sum(fitted[name] for name in HELD)
    if fitted["weights"] > budget:
        return text + f"; the weights alone need {fitted['weights'] / GB:.3f} GB, so fewer prompts or shorter " \
            "completions cannot help: a smaller model or a larger card"
    if held > budget:
        return text + f"; what every step holds ({', '.join(HELD)}) needs {held / GB:.3f} GB, so fewer prompts or " \
            "shorter completions cannot help: a smaller model or a larger card"
    return text + " (fewer prompts per step, shorter completions or a smaller model)"
