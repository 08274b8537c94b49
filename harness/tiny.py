"""The tiny offline default: a ~2M-parameter Llama with a character tokenizer, its CPU defaults, its warm start.

A real `LlamaForCausalLM` and a `PreTrainedTokenizerFast`, so generate / save_pretrained /
from_pretrained are the ordinary Hugging Face paths; warm-started on the task's own solutions
(`warm_start`) while held-out pass@1 is still low, so that RL has room to improve it.
"""
import dataclasses
import json
import os
import random
import re
import zlib

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from harness.files import RunError, refuse_link
from harness.manifest import save_policy_atomically, verify_manifest
from harness.config import DEFAULT_PATIENCE
from harness.watch import warm_start_advice
from rollout import evaluate
from tasks import COMPACT_ALPHABET

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
# The settings a CPU-sized character model needs instead of the papers' (config.Config holds those): lr 3e-4 (a 2M
# model trained almost from scratch, not 1e-6), 12 new tokens (its answers are one short line), one CPU thread (tiny
# matmuls gain nothing from more), and 2-number Countdown (with 3 numbers RL turns its pass@32 into pass@1 but
# cannot teach it the arithmetic; docs/results.md).
CPU_DEFAULTS = dict(lr=3e-4, max_new_tokens=12, threads=1)
COUNTDOWN_OPTIONS = {"num_count": 2}
# The warm start's own held-out draw, on which its stopping rule reads pass@1: a fixed size, not --eval-size (the
# run's evals), so a run's eval size leaves its warm start, and its cache key, alone. 200 = --eval-size's default:
# the default run's warm start is the one it always was.
WARM_START_EVAL_SIZE = 200
WARM_START_EVAL_EVERY = 10  # supervised steps between the warm start's evals (its patience counts evals)


# The model: character tokenizer + small Llama
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


def prompt_style(tokenizer):
    """"compact" (one-line task prompts) for the tiny character vocabulary, "chat" for every other tokenizer: told
    from the tokenizer itself, so a saved tiny checkpoint (runs/default/latest) is recognised too."""
    return "compact" if set(tokenizer.get_vocab()) <= set(SPECIAL_TOKENS) | set(COMPACT_ALPHABET) else "chat"


def apply_cpu_defaults(config):
    """The defaults hook: a copy of config with CPU_DEFAULTS (and 2-number Countdown) for the settings the command
    line left open."""
    changes = {key: value for key, value in CPU_DEFAULTS.items() if key not in config.given}
    if config.task == "countdown":
        changes["task_options"] = {**COUNTDOWN_OPTIONS, **config.task_options}
    return dataclasses.replace(config, **changes)


# Warm start: supervised fine-tuning on the task's own solutions, stopped early, cached on disk
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


def warm_start_settings(config):
    """Everything the warm start depends on: the key of its cache folder (warm_start_dir)."""
    settings = {key: getattr(config, key) for key in ("task", "task_options", "data", "seed", "tiny_hidden",
                                                      "tiny_layers", "warm_start_steps", "warm_start_target",
                                                      "max_new_tokens")}
    if config.warm_start_patience != DEFAULT_PATIENCE:  # keyed only when set: the default keeps its folder name
        settings["warm_start_patience"] = config.warm_start_patience
    return {**settings, "task_file_sha256": config.task_file_sha256} if config.task_file_sha256 else settings


def warm_start_dir(cache_root, settings):
    """<cache_root>/warm_start-<task>-h<H>-l<L>-<crc32 of settings>: the warm start's cache folder;
    settings (warm_start_settings) holds everything it depends on, so any change gives a new
    folder."""
    tag = f"{zlib.crc32(json.dumps(settings, sort_keys=True, default=str).encode()):08x}"
    task = re.sub(r"\W", "_", os.path.splitext(os.path.basename(settings["task"]))[0])  # a task file: its name
    name = f"warm_start-{task}-h{settings['tiny_hidden']}-l{settings['tiny_layers']}-{tag}"
    return os.path.join(cache_root, name)


def warm_start(model, tokenizer, task, *, cache_dir, eval_examples, max_steps=1500, batch_size=64, lr=3e-3,
               target_pass=0.1, eval_every=WARM_START_EVAL_EVERY, patience=DEFAULT_PATIENCE, max_new_tokens=12,
               seed=0, log=print):
    """Supervised warm start on (compact prompt, task.solution) pairs, cross-entropy on the solution
    and EOS; returns (model, info). Stops at the first eval (greedy pass@1 on `eval_examples`, every
    `eval_every` steps) with pass@1 >= target_pass, after `patience` evals without a new best, or
    after max_steps, holding its best eval's weights; info["stopped"] says which ("target",
    "patience", "steps"). Cached in `cache_dir`.
    """
    info_path = os.path.join(cache_dir, "warm_start.json")
    if os.path.exists(info_path):  # complete by construction: the folder is renamed into place when done
        info = read_small_json(info_path)
        log(f"warm start: loaded {cache_dir} (pass@1 {info['pass@1']:.3f} after {info['steps']} steps, on the warm "
            "start's own held-out draw; the run's evals use another)")
        return load_warm_start(cache_dir, info, model, log), info
    torch.manual_seed(seed)
    rng = random.Random(seed)
    pool = task.examples("train", min(max_steps * batch_size, 4000), seed=seed + 1)  # 2-number countdown has ~6k
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    log(f"warm start: supervised steps until held-out pass@1 >= {target_pass} (at most {max_steps}; cached in "
        f"{cache_dir}; its held-out draw is its own, the run's evals use another)")
    step, metrics, best, stale, stopped = 0, {"pass@1": 0.0, "reward": 0.0}, 0.0, 0, "steps"
    kept = None  # (step, eval, weights) of the best eval so far: what RL starts from when the target is not met
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
                stopped = "target"
                break
            best, stale = (metrics["pass@1"], 0) if metrics["pass@1"] > best else (best, stale + 1)
            if stale == 0:
                kept = step, metrics, {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            if stale >= patience:
                stopped = "patience"
                log(f"warm start: held-out pass@1 stopped improving at {best:.3f}, below the target {target_pass} "
                    f"(no gain in {patience * eval_every} steps: --warm-start-patience {patience})")
                break
    if stopped != "target" and kept and kept[0] != step:  # hand RL the best weights, not the last
        model.load_state_dict(kept[2])
        metrics = kept[1]
        log(f"warm start: RL starts from step {kept[0]}'s weights, its best held-out pass@1 {best:.3f}")
    info = {"steps": step, "pass@1": metrics["pass@1"], "reward": metrics["reward"], "loss": loss.item(),
            "stopped": stopped, "best": max(best, metrics["pass@1"])}
    save_policy_atomically(model, tokenizer, cache_dir, info, cache=True)
    return model, info


def load_warm_start(cache_dir, info, model, log=print):
    """The cached warm start in cache_dir, checked as a checkpoint is (manifest, every tensor of
    `model` present and finite) and loaded as any model folder is; else a RunError naming the file
    or the tensor."""
    from harness.model import model_source, one_line_load_errors, weights_dtype
    hint = "delete that warm-start folder (the run trains it again)"
    try:
        path, kwargs = model_source(cache_dir)
        with one_line_load_errors(cache_dir, kwargs):
            cached, loading = AutoModelForCausalLM.from_pretrained(path, **weights_dtype(model.dtype), **kwargs,
                                                                  output_loading_info=True)
    except ValueError as error:
        raise RunError(f"{error}; {hint}") from None
    missing = sorted(loading["missing_keys"]) + sorted(loading["mismatched_keys"])
    if missing:
        raise RunError(f"{cache_dir}: the warm start lacks the weight {str(missing[0])!r} (of {len(missing)} "
                       f"missing or of another shape); {hint}")
    for name, value in cached.state_dict().items():
        if value.is_floating_point() and not torch.isfinite(value).all():
            raise RunError(f"{cache_dir}: the warm start's weight {name!r} is not finite (nan or inf); {hint}")
    if not verify_manifest(cache_dir, hint):  # last: a damaged file is named first by the check that reads it
        log(f"note: {cache_dir} was cached before warm starts listed their files' sha256: its tensors are checked, "
            "its files are not")
    return cached.to(model.device)


def read_small_json(path, limit=1 << 20):
    """A JSON object from a regular file of at most `limit` bytes; else a RunError naming the file (a cache folder
    is not trusted to be what this code wrote: a link to /dev/zero or a FIFO must not hang or fill memory)."""
    if not os.path.isfile(path) or os.path.getsize(path) > limit:
        raise RunError(f"{path} is not a regular file of at most {limit} bytes; delete that warm-start folder")
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    try:
        info = json.loads(data)
    except ValueError:
        info = None
    if not isinstance(info, dict) or not {"steps", "pass@1"} <= set(info):
        raise RunError(f"{path} is not a warm start's info; delete that warm-start folder")
    return info


def initial_policy_dir(config):
    """Where a fresh tiny run's initial weights are kept (the reference policy of --kl-coef): its warm start's
    cache folder, decided from the settings alone."""
    return os.path.abspath(warm_start_dir(config.warm_start_cache or config.output_dir, warm_start_settings(config)))


def warm_start_seen(config):
    """A fresh tiny run's warm start as its degenerate-start note reads it (watch.warm_start_advice): the cached
    info (warm_start) with the settings that stopped it; {"steps": 0} without one; None for any other run (a
    resumed one: its notes were said when it started)."""
    if config.model != "tiny" or config.resume:
        return None
    path = os.path.join(initial_policy_dir(config), "warm_start.json")
    if not config.warm_start_steps or not os.path.exists(path):
        return {"steps": 0}
    return {**read_small_json(path), "target": config.warm_start_target, "max_steps": config.warm_start_steps,
            "patience": config.warm_start_patience, "eval_every": WARM_START_EVAL_EVERY}


def prepare(config, model, tokenizer, task, *, log=print):
    """A fresh tiny run's initial policy: the cached warm start (trained now if missing), or the random init when
    warm_start_steps is 0, kept in initial_policy_dir(config). -> the model."""
    folder = refuse_link(initial_policy_dir(config))  # loaded or written: never through a link planted there
    if config.warm_start_steps > 0 and not hasattr(task, "solution"):
        log(f"note: task {task.name} has no solution(example, style): no warm start, the tiny model starts from "
            "random weights and will learn little (give the task a solution to warm-start it)")
    if config.warm_start_steps > 0 and hasattr(task, "solution"):
        model, info = warm_start(model, tokenizer, task, cache_dir=folder, max_steps=config.warm_start_steps,
                                 target_pass=config.warm_start_target, patience=config.warm_start_patience,
                                 max_new_tokens=config.max_new_tokens,
                                 eval_examples=task.examples("test", WARM_START_EVAL_SIZE, seed=config.seed + 1),
                                 seed=config.seed, log=log)
        if info["pass@1"] == 0:
            log(f"note: the warm start ended at held-out pass@1 0.000 after {info['steps']} steps: RL will sample "
                "from a policy that never passes, so its groups may all tie and nothing be learned; "
                f"{warm_start_advice(warm_start_seen(config), 0.0)} (docs/tasks.md)")
    else:
        save_policy_atomically(model, tokenizer, folder, cache=True)
    return model
