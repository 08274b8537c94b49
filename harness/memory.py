"""The memory plan: what a run holds at its peak, estimated from the model's shape alone (no weights loaded).

    shape = model_shape(config.model)              # a hub id's or folder's config.json, a .gguf header, or tiny
    plan = memory_plan(shape, config, prompt_length)
    print(plan_text(plan))                         # --dry-run prints it; --memory-budget adds fitting_settings()

Every formula is here, once (docs/performance.md, "What fits a card", measures them against peak RSS). The run
holds, all the time: the fp32 weights, their gradients and AdamW's two moments (LoRA: the adapters' only), and the
reference policy of --kl-coef (a full fp32 copy; LoRA: none, the policy with its adapters off). On top of that, at
different moments (so the peak takes the larger): the rollout phase's KV cache and sampling logits, or the update
phase's activations of one micro-batch and its float32 log-prob logits chunk (or AdamW's step temporaries).
Simplifications, each one line below: attention saves no [S, S] matrix (SDPA's flash/efficient kernels; true on
CPU and GPU here), every completion runs to --max-new-tokens, and the prompt length is --max-prompt-length (or a
guess the plan names).
"""
import dataclasses
import json
import math
import os
import re

GB = 1e9
UNITS = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30,
         "TIB": 2**40, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
PROMPT_GUESS = {"compact": 16, "chat": 256}  # tokens, when --max-prompt-length does not say


def parse_size(text):
    """"24GB" -> 24e9 bytes, "24GiB" or "24G" -> 24 * 2**30, "512MB" -> 512e6; None when it is not a size."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", str(text).upper())
    if not match or match.group(2) not in UNITS or float(match.group(1)) <= 0:
        return None
    return float(match.group(1)) * UNITS[match.group(2)]


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


def shape_from_config(config):
    """A transformers config (or any object with its field names) -> ModelShape."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = config.num_attention_heads
    return ModelShape(hidden=config.hidden_size, intermediate=config.intermediate_size,
                      layers=config.num_hidden_layers, heads=heads,
                      kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                      head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
                      vocab=config.vocab_size, tied=bool(getattr(config, "tie_word_embeddings", False)),
                      qkv_bias=getattr(config, "model_type", "") == "qwen2" or bool(getattr(config, "attention_bias",
                                                                                             False)))


# Qwen2.5's config.json numbers (huggingface.co/Qwen/Qwen2.5-{size}/config.json), written out so that nothing downloads.
QWEN25 = {name: ModelShape(hidden=h, intermediate=i, layers=n, heads=q, kv_heads=kv, head_dim=h // q, vocab=151936,
                           tied=tied, qkv_bias=True)
          for name, (h, i, n, q, kv, tied) in {"qwen2.5-0.5b": (896, 4864, 24, 14, 2, True),
                                               "qwen2.5-1.5b": (1536, 8960, 28, 12, 2, True),
                                               "qwen2.5-3b": (2048, 11008, 36, 16, 2, True),
                                               "qwen2.5-7b": (3584, 18944, 28, 28, 4, False)}.items()}


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
    header, a folder's config.json, or transformers' AutoConfig (the hub cache, or the hub when online)."""
    from harness import model as model_files
    from harness import tiny
    known = re.fullmatch(r"qwen/(qwen2\.5-[\d.]+b)(-instruct)?", config.model.lower())
    if known and known.group(1) in QWEN25:
        return QWEN25[known.group(1)]
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
    """A config.json read as attributes (text_config first, for multimodal configs)."""
    def __init__(self, fields):
        self.__dict__.update(fields.get("text_config", fields))


# ---------------------------------------------------------------------------------------------------------------
# The plan: bytes of each part, the peak
# ---------------------------------------------------------------------------------------------------------------
def memory_plan(shape, config, prompt_length):
    """-> {part: bytes} of a run of config (its settled --dtype) on a model of `shape`, plus "peak" and what it
    assumed. Weights, gradients and AdamW are fp32 whatever --dtype (train.py); activations and the KV cache are in
    the compute dtype, except the residual stream and RMSNorm, which stay fp32 under autocast."""
    compute = 2 if config.dtype == "bf16" else 4  # bytes per activation element
    P, T, M = prompt_length, config.max_new_tokens, config.num_generations
    rows = config.prompts_per_step * M
    generate_rows = min(config.rollout_batch or rows, rows) // M * M  # whole groups per generate call
    micro = min(config.micro_batch, rows)
    trained = shape.lora_parameters(config.lora_rank, config.lora_targets) if config.lora_rank else \
        shape.parameters()
    weights = 4 * (shape.parameters() + (trained if config.lora_rank else 0))
    H, I, L = shape.hidden, shape.intermediate, shape.layers
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    # One decoder layer saves, per token: fp32 residual stream and the 2 RMSNorms' input and output (4H x 4 bytes),
    # under autocast the linears' bf16 copies of the 2 norm outputs; q, attention output, o_proj's input (3q),
    # k and v (2kv), the MLP's gate, SiLU, up and their product (4I), in the compute dtype.
    per_token_layer = 16 * H + (4 * H if compute == 2 else 0) + compute * (3 * q + 2 * kv + 4 * I)
    shared = not config.gradient_checkpointing and micro > 1 and P > 1  # fast/logprobs.py's completion_features
    if not shared:  # the plain forward: every row's P + T tokens (checkpointed: each layer keeps only its input)
        tokens = micro * (P + T)
        layer_activations = 4 * H * tokens * L + per_token_layer * tokens if config.gradient_checkpointing else \
            L * per_token_layer * tokens  # checkpointed: + one layer recomputed in backward
    else:  # shared prompts: each distinct prompt's P tokens once, every row's T, and each row's K, V over P + T
        tokens = math.ceil(micro / M) * P + micro * T
        layer_activations = L * (per_token_layer * tokens + compute * 2 * kv * micro * P)
    head_tokens = micro * T  # the tokens whose log-probs are scored
    logit_chunk = 3 * 4 * shape.vocab * min(config.logit_chunk, head_tokens)  # logits, their scaling, softmax
    autocast_copies = 2 * trained if compute == 2 and not config.lora_rank else 0  # bf16 casts of trained weights
    plan = {
        "weights": weights,
        "gradients": 4 * trained,
        "optimizer": int((2 * (1 + 4 / 256) if config.optimizer == "adamw8bit" else 8) * trained),  # AdamW's moments:
        # fp32, or 8-bit codes with a float32 scale per block of 256 (torchao: tensors of >= 4096 weights)
        "reference": 4 * shape.parameters() if config.kl_coef > 0 and not config.lora_rank else 0,
        "kv_cache": compute * 2 * L * kv * generate_rows * (P + T),
        "sampling_logits": 3 * 4 * shape.vocab * generate_rows,  # float32 logits, scaled, softmax of one token
        "activations": layer_activations + 8 * H * tokens + autocast_copies,  # + the final norm's input and output
        "logit_chunk": logit_chunk,
        # the LM head's and the embedding's fp32 [V, H] gradients, each made whole in backward before .grad += it
        "head_gradients": 0 if config.lora_rank else 8 * shape.vocab * H,
        "optimizer_step": 4 * trained if config.device.startswith("cuda") else 0,  # foreach AdamW's temporary
    }
    held = plan["weights"] + plan["gradients"] + plan["optimizer"] + plan["reference"]
    plan["rollout_peak"] = held + plan["kv_cache"] + plan["sampling_logits"]
    plan["update_peak"] = held + max(plan["activations"] + plan["logit_chunk"] + plan["head_gradients"],
                                     plan["optimizer_step"])
    plan["peak"] = max(plan["rollout_peak"], plan["update_peak"])
    plan["assumed"] = dict(prompt_length=P, completion_length=T, rows=rows, generate_rows=generate_rows,
                           micro_batch=micro, trained_parameters=trained, parameters=shape.parameters())
    return plan


PARTS = ("weights", "gradients", "optimizer", "reference", "kv_cache", "sampling_logits", "activations",
         "logit_chunk", "head_gradients", "optimizer_step")


def fitting_settings(shape, config, prompt_length, budget, *, lora=True):
    """The least change of the memory settings that brings the plan's peak under `budget` bytes -> (changes dict,
    plan), or (None, the smallest plan tried). Tried in order: smaller micro-batches and rollout batches, then
    activation checkpointing, then (lora=True) LoRA of rank 16 on the default targets with each of those."""
    rows = config.prompts_per_step * config.num_generations
    micro_batches = sorted({m for m in (config.micro_batch, 16, 8, 4, 2, 1) if m <= config.micro_batch}, reverse=True)
    rollout_batches = sorted({r for r in (config.rollout_batch or rows, 256, 128, 64, 32, 16)
                              if config.num_generations <= r <= (config.rollout_batch or rows)}, reverse=True)
    levels = [{}, {"gradient_checkpointing": True}]
    if lora and not config.lora_rank:
        levels += [{"lora_rank": 16}, {"lora_rank": 16, "gradient_checkpointing": True}]
    smallest = None
    for level in levels:
        for micro in micro_batches:
            for rollout in rollout_batches:
                changes = {**level, "micro_batch": micro, "rollout_batch": rollout}
                changes = {k: v for k, v in changes.items() if getattr(config, k) != v and
                           not (k == "rollout_batch" and v == rows and config.rollout_batch is None)}
                plan = memory_plan(shape, dataclasses.replace(config, **changes), prompt_length)
                if plan["peak"] <= budget:
                    return changes, plan
                smallest = plan if smallest is None or plan["peak"] < smallest["peak"] else smallest
    return None, smallest


def plan_text(plan, budget=None, fit=None):
    """The plan as lines of text: each part in GB, the two phases' peaks, and (with a budget) what fits."""
    a = plan["assumed"]
    lines = [f"memory plan (estimated; docs/performance.md): {a['parameters'] / 1e6:.1f}M parameters, "
             f"{a['trained_parameters'] / 1e6:.2f}M trained; {a['rows']} rows of {a['prompt_length']} prompt + "
             f"{a['completion_length']} completion tokens, {a['generate_rows']} per generate call, "
             f"{a['micro_batch']} per micro-batch"]
    lines += [f"  {name.replace('_', ' '):<16s}{plan[name] / GB:9.3f} GB" for name in PARTS if plan[name]]
    lines.append(f"  peak: {plan['peak'] / GB:.3f} GB (rollout phase {plan['rollout_peak'] / GB:.3f}, "
                 f"update phase {plan['update_peak'] / GB:.3f})")
    if budget is not None:
        changes, fitted = fit
        flags = lambda c: " ".join(f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}")  # noqa: E731
                                   for k, v in sorted(c.items()))
        lines.append(f"  budget {budget / GB:.1f} GB: " + (
            "fits as it is" if changes == {} else
            f"fits with {flags(changes)} (peak {fitted['peak'] / GB:.3f} GB)" if changes is not None else
            f"does not fit: the smallest plan tried needs {fitted['peak'] / GB:.3f} GB (fewer prompts per step, "
            "shorter completions or a smaller model)"))
    return "\n".join(lines)
