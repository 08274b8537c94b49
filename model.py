"""The policy: load any causal LM (HF id, local folder, .gguf file) or build the tiny offline default.

The tiny default is a real `LlamaForCausalLM` (~2M parameters) with a character-level tokenizer made with
`tokenizers` and wrapped as a `PreTrainedTokenizerFast`, so generate / save_pretrained / from_pretrained are
the ordinary Hugging Face code paths. Before RL it is warm-started by a short supervised phase on the task's own
solutions (`warm_start`), stopped while its held-out pass@1 is still low so that RL has room to improve it.
"""
import importlib.util
import json
import os
import random
import zlib

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from rollout import evaluate

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")


# ---------------------------------------------------------------------------------------------------------------
# The tiny default: character tokenizer + small Llama
# ---------------------------------------------------------------------------------------------------------------
def build_char_tokenizer(alphabet):
    """One token per character of `alphabet` plus <pad> <bos> <eos> <unk>; encoding prepends <bos>."""
    chars = sorted(set(alphabet))
    vocab = {token: i for i, token in enumerate(list(SPECIAL_TOKENS) + chars)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")  # every character alone
    tokenizer.decoder = decoders.Fuse()                                                # join without spaces
    tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>", padding_side="left")


def build_tiny_model(tokenizer, *, hidden_size=192, num_layers=4, num_heads=4, max_positions=128, seed=0):
    """A LlamaForCausalLM sized for a CPU: hidden 192, 4 layers, MLP 512, tied embeddings -> ~1.8M parameters."""
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden_size,
                         intermediate_size=(8 * hidden_size // 3 + 63) // 64 * 64,  # Llama's 8/3 ratio, rounded
                         num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
                         max_position_embeddings=max_positions, tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


# ---------------------------------------------------------------------------------------------------------------
# Loading: "tiny" | local folder | .gguf file | Hugging Face hub id
# ---------------------------------------------------------------------------------------------------------------
def load_policy(model_arg, *, dtype=torch.float32, device="cpu", alphabet=None, tiny_hidden=192, tiny_layers=4,
                seed=0):
    """-> (model, tokenizer). `model_arg`: "tiny", a save_pretrained folder, a .gguf file, or a hub id.

    Errors are one-line ValueErrors (a path that does not exist, a .gguf without the `gguf` package, a hub id
    that cannot be fetched). The tokenizer always has a pad token (EOS when the model defines none).
    """
    if model_arg == "tiny":
        tokenizer = build_char_tokenizer(alphabet)
        model = build_tiny_model(tokenizer, hidden_size=tiny_hidden, num_layers=tiny_layers, seed=seed)
        return model.to(device=device, dtype=dtype), tokenizer
    path = os.path.expanduser(model_arg)
    looks_like_path = path.startswith((".", "/", "~")) or path.endswith(".gguf")
    if looks_like_path and not os.path.exists(path):
        raise ValueError(f"model path does not exist: {model_arg}")
    kwargs = {}
    if path.endswith(".gguf"):
        missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
        if missing:
            raise ValueError(f"loading a .gguf file needs: pip install {' '.join(missing)}")
        path, kwargs["gguf_file"] = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    except (OSError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"could not load model {model_arg!r}: {first_line}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model.to(device), tokenizer


# ---------------------------------------------------------------------------------------------------------------
# Warm start: supervised fine-tuning on the task's own solutions, stopped early, cached on disk
# ---------------------------------------------------------------------------------------------------------------
def sft_batch(tokenizer, task, examples):
    """Right-padded [prompt <bos>... | solution <eos>] ids, attention mask, and the labels (-100 off the solution)."""
    rows, labels = [], []
    for ex in examples:
        prompt = tokenizer(task.prompt(ex, "compact"))["input_ids"]
        answer = tokenizer(task.solution(ex, "compact"), add_special_tokens=False)["input_ids"]
        rows.append(prompt + answer + [tokenizer.eos_token_id])
        labels.append([-100] * len(prompt) + answer + [tokenizer.eos_token_id])
    width = max(len(r) for r in rows)
    input_ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    attention_mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    label_ids = torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels])
    return input_ids, attention_mask, label_ids


# train.py arguments a warm start depends on: a change to any of them must not reuse an old cache folder
WARM_START_SETTINGS = ("task", "data", "task_options", "seed", "tiny_hidden", "tiny_layers", "warm_start_steps",
                       "warm_start_target", "max_new_tokens", "eval_size")


def warm_start_dir(args):
    """<output-dir>/warm_start-<task>-h<H>-l<L>-<crc32 of WARM_START_SETTINGS>: the warm start's cache folder."""
    settings = json.dumps({name: getattr(args, name) for name in WARM_START_SETTINGS}, sort_keys=True, default=str)
    tag = f"{zlib.crc32(settings.encode()):08x}"
    return os.path.join(args.output_dir, f"warm_start-{args.task}-h{args.tiny_hidden}-l{args.tiny_layers}-{tag}")


def warm_start(model, tokenizer, task, *, cache_dir, eval_examples, max_steps=1500, batch_size=64, lr=3e-3,
               target_pass=0.1, eval_every=10, max_new_tokens=12, seed=0, log=print):
    """Supervised warm start; returns (model, info). Stops at the first eval with pass@1 >= target_pass.

    Trains on (compact prompt, task.solution) pairs with cross-entropy on the solution tokens and EOS only.
    Every `eval_every` steps: greedy pass@1 on `eval_examples` (held out). The result is saved to `cache_dir`
    (a save_pretrained folder + warm_start.json); when that folder exists, it is loaded instead of trained.
    """
    info_path = os.path.join(cache_dir, "warm_start.json")
    if os.path.exists(info_path):
        with open(info_path) as f:
            info = json.load(f)
        log(f"warm start: loaded {cache_dir} (pass@1 {info['pass@1']:.3f} after {info['steps']} steps)")
        cached = AutoModelForCausalLM.from_pretrained(cache_dir, dtype=model.dtype).to(model.device)
        return cached, info
    torch.manual_seed(seed)
    rng = random.Random(seed)
    pool = task.examples("train", min(max_steps * batch_size, 4000), seed=seed + 1)  # 2-number countdown has ~6k
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    step, metrics = 0, {"pass@1": 0.0, "reward": 0.0}
    while step < max_steps:
        input_ids, attention_mask, labels = sft_batch(tokenizer, task, rng.sample(pool, batch_size))
        loss = model(input_ids=input_ids.to(model.device), attention_mask=attention_mask.to(model.device),
                     labels=labels.to(model.device)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        if step % eval_every == 0 or step == max_steps:
            metrics = evaluate(model, tokenizer, task, eval_examples, style="compact", max_new_tokens=max_new_tokens)
            log(f"warm start step {step}: loss {loss.item():.3f}  held-out pass@1 {metrics['pass@1']:.3f}")
            if metrics["pass@1"] >= target_pass:
                break
    info = {"steps": step, "pass@1": metrics["pass@1"], "reward": metrics["reward"], "loss": loss.item()}
    model.save_pretrained(cache_dir)
    tokenizer.save_pretrained(cache_dir)
    with open(info_path, "w") as f:
        json.dump(info, f)
    return model, info
