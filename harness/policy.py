"""The run's policy, its reference and its optimizer: built fresh, or restored from a checkpoint.

    model, ref_model = build_policy(config, tokenizer, task)     # seeded; --resume: its weights, checked
    optimizer = adamw_class(config)(trained, lr=config.lr, ...)  # AdamW, 8-bit, fp32 masters or bf16-sr; finite steps
    saved = restore_trainer_state(config.resume, model, optimizer)  # --resume: its optimizer and RNG states
    set_learning_rate(optimizer, config, step)                    # warm-up, then constant

A resumed checkpoint is the run's own file (a RunError naming it, exit 1); any other model source is the user's input
(an InputError, exit 2).
"""
import contextlib
import copy
import functools
import random

import numpy as np
import torch
import transformers

from harness import tiny
from harness.checkpoint import (check_weights, instead_of, load_trainer_state, restore_rng, tensor_problem,
                                verify_checkpoint)
from harness.config import InputError
from harness.console import say
from harness.files import RunError
from harness.flags import require_library
from harness.lean_optimizer import LeanAdamW
from harness.master_weights import MasterWeights
from harness.model import add_lora, enable_checkpointing, load_adapters, load_policy, quantize_base, without_adapters


@contextlib.contextmanager
def policy_load_errors(config):
    """Around loading the policy's tokenizer or weights: a resumed checkpoint is the run's own file (a RunError,
    exit 1, like its other files), any other source is the user's input (an InputError, exit 2)."""
    try:
        yield
    except ValueError as error:  # the checkpoint named once: model.py's message names it already, or not
        named = "" if str(error).startswith(str(config.resume)) else f"{config.resume}: "
        raise (RunError(f"{named}{error}; resume from another checkpoint") if config.resume else
               InputError(str(error))) from None


def tf32_matmuls():
    """CUDA's float32 matmuls on TF32 tensor cores (operands cut to 10 mantissa bits): under a bf16
    body, the float32 LM head at half the bf16 rate instead of IEEE float32's ~1/15 (H100)."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9
        matmul.fp32_precision = "tf32"
    else:
        matmul.allow_tf32 = True


def build_policy(config, tokenizer, task, *, log=print):
    """Seed everything, load the policy (a fresh tiny run: its warm start, tiny.py) and, when kl_coef > 0, the
    frozen reference policy (the initial weights). -> (model, ref_model or None)."""
    transformers.utils.logging.disable_progress_bar()  # the loop's tqdm bar is the only one
    torch.manual_seed(config.seed)
    random.seed(config.seed)
    np.random.seed(config.seed)
    device = torch.device(config.device)
    with policy_load_errors(config):
        if config.model == "tiny" and not config.resume:  # random init, then its warm start (below)
            model = tiny.build_tiny_model(tokenizer, hidden_size=config.tiny_hidden, num_layers=config.tiny_layers,
                                          seed=config.seed).to(device)
        else:  # a resumed LoRA run: its base (the initial weights), then its adapters (below)
            source = config.initial_policy if config.resume and config.lora_rank else config.resume or config.model
            model, _ = load_policy(source, device=device, tokenizer=tokenizer)
    if config.resume:  # its weights (a LoRA run's: its adapters) as saved, before anything runs on them
        check_weights(config.resume, storage_dtype(config), model)
    if config.threads:
        torch.set_num_threads(config.threads)
    if device.type == "cuda" and config.dtype == "bf16" and not config.logprob_fp32:
        tf32_matmuls()  # rollout.token_logprobs' float32 head on tensor cores (DESIGN.md 5)
    if not config.resume and config.model == "tiny":
        model = tiny.prepare(config, model, tokenizer, task, log=log)
    elif not config.resume and config.style == "chat" and not getattr(tokenizer, "chat_template", None):
        log(f"note: {config.model} has no chat template; prompts are a plain-text User/Assistant conversation")
    log(f"task {task.name} (reward rules: {config.rules}), prompts: {config.style}, method {config.method}"
        + (f", AR alpha {config.alpha:g}" if config.alpha > 0 else "")
        + (f", Lopti eta {config.lopti_eta:g} ({config.lopti_order})" if config.lopti_eta > 0 else "")
        + f", lr {config.lr:g}, max new tokens {config.max_new_tokens}")
    model = memory_options(config, model.to(storage_dtype(config)))  # after the warm start: LoRA trains on the RL
    ref_model = None  # step only; --param-dtype bf16: the warm start and a resumed checkpoint load in fp32, then cast
    if config.kl_coef > 0 and config.lora_rank:  # the policy with its adapters off: no second copy of the weights
        ref_model = without_adapters(model)
    elif config.kl_coef > 0:
        try:
            ref_model = copy.deepcopy(model) if not config.resume else load_policy(  # loaded as the policy was:
                config.initial_policy, device=device)[0].to(storage_dtype(config))  # a bf16 load differs (RoPE)
        except ValueError as error:
            raise RunError(f"the reference (initial) policy for --kl-coef could not be loaded: {error}") from None
    if ref_model is not None:
        ref_model.eval().requires_grad_(False)
    return model, ref_model


def storage_dtype(config):
    """The torch dtype of the policy's (and the reference's) weights: --param-dtype."""
    return torch.bfloat16 if config.param_dtype in ("bf16", "bf16-sr") else torch.float32


def adamw_class(config):
    """torch.optim.AdamW, or torchao's AdamW8bit (--optimizer adamw8bit; compiled: minutes at its
    first step on a CPU); on fp32 masters under --param-dtype bf16 (MasterWeights); LeanAdamW for
    bf16-sr or --step-in-backward."""
    if config.param_dtype == "bf16-sr" or config.step_in_backward:
        return finite_steps(functools.partial(LeanAdamW, moments="8bit" if config.optimizer == "adamw8bit" else
                                              "fp32", seed=config.seed, step_in_backward=config.step_in_backward))
    inner = optimizer_class(config)
    if config.optimizer_offload:  # every master and the moments in CPU memory (a CUDA run; hardware() checks)
        return finite_steps(functools.partial(MasterWeights, inner_class=inner, state_device="cpu"))
    return finite_steps(functools.partial(MasterWeights, inner_class=inner) if config.param_dtype == "bf16"
                        else inner)


def finite_steps(make_optimizer):
    """make_optimizer(params, **options) -> a function building the same optimizer, whose step() is
    skipped while a gradient holds a nan or inf, counted in optimizer.skipped_steps (RunState.log
    says so). --step-in-backward leaves step() no gradient to check; save_checkpoint still refuses a
    weight that is not finite."""
    def build(params, **options):
        params = list(params)
        optimizer = make_optimizer(params, **options)
        take_step = optimizer.step

        def step(*args, **kwargs):
            grads = [p.grad for p in params if p.grad is not None]
            if grads and not torch.stack([torch.isfinite(grad).all() for grad in grads]).all():
                optimizer.skipped_steps += 1
                return None
            return take_step(*args, **kwargs)
        optimizer.step, optimizer.skipped_steps = step, 0
        return optimizer
    return build


def fused_adamw(params, **options):
    """torch.optim.AdamW, fused (one kernel for every weight, no per-tensor launches) when all its weights are on
    CUDA; elsewhere (a CPU, --optimizer-offload's CPU masters) as torch builds it."""
    params = list(params)
    weights = [w for item in params for w in (item["params"] if isinstance(item, dict) else [item])]
    on_cuda = bool(weights) and all(w.is_cuda for w in weights)
    return torch.optim.AdamW(params, **options, **({"fused": True} if on_cuda else {}))


def optimizer_class(config):
    """adamw_class's optimizer for fp32 weights."""
    if config.optimizer == "adamw":
        return fused_adamw
    require_library("torchao", "--optimizer adamw8bit")
    from torchao.optim import AdamW8bit

    class AdamW8bitFloatLR(AdamW8bit):  # torchao wants lr as a tensor; the loop's warm-up sets a float
        def step(self, closure=None):
            rates = [group["lr"] for group in self.param_groups]
            for group in self.param_groups:
                group["lr"] = torch.as_tensor(group["lr"], dtype=torch.float32)
            try:
                return super().step(closure)
            finally:  # the metrics and the checkpoint read a plain float
                for group, rate in zip(self.param_groups, rates):
                    group["lr"] = float(rate)
    return AdamW8bitFloatLR


# lr: the loop's warm-up sets it before every step; fused, foreach: how (not what) the step computes
OPTIMIZER_SETTINGS_SET_EACH_STEP = {"lr", "fused", "foreach"}


def check_optimizer_settings(optimizer, saved, checkpoint_dir):
    """A RunError naming the setting when a checkpoint's optimizer param_groups say anything but what this run's
    settings built (weight decay, betas, eps, `maximize`, ...): load_state_dict would silently take the file's."""
    inner = saved.get("inner")  # MasterWeights (--param-dtype bf16): the inner optimizer's state holds the groups
    groups = (inner if isinstance(inner, dict) else saved).get("param_groups")
    if not isinstance(groups, list) or len(groups) != len(optimizer.param_groups) or \
            not all(isinstance(group, dict) for group in groups):
        raise RunError(f"{checkpoint_dir}/trainer_state.pt: its optimizer state does not fit this model (other "
                       "parameter groups); resume from another checkpoint")
    for ours, theirs in zip(optimizer.param_groups, groups):
        for key in sorted((set(ours) | set(theirs)) - {"params"} - OPTIMIZER_SETTINGS_SET_EACH_STEP):
            mine, other = ours.get(key, "absent"), theirs.get(key, "absent")
            if torch.is_tensor(mine) or torch.is_tensor(other):
                same = torch.is_tensor(mine) and torch.is_tensor(other) and torch.equal(mine, other)
            else:  # (0.9, 0.999) saved as a list is the same; True is not 1
                plain = lambda v: list(v) if isinstance(v, tuple) else v  # noqa: E731
                same = plain(mine) == plain(other) and isinstance(mine, bool) == isinstance(other, bool)
            if not same:
                raise RunError(f"{checkpoint_dir}/trainer_state.pt: its optimizer's {key} is {other!r}, but this "
                               f"run's settings (run.json) make it {mine!r}; resume from another checkpoint")


def check_master_weights(optimizer, model, saved, checkpoint_dir):
    """--param-dtype bf16 (MasterWeights): a RunError naming the weight when a checkpoint's master weight is not a
    finite tensor of its master's dtype (fp32) and its parameter's shape (load_state_dict would cast an int64 one
    to whole numbers, and a nan would reach the weights). A list of another length is load_state_dict's error."""
    if not isinstance(optimizer, MasterWeights):
        return
    pairs, masters = [(p, m) for p, m in zip(optimizer.params, optimizer.masters) if m is not p], saved.get("masters")
    if not isinstance(masters, list) or len(masters) != len(pairs):
        return
    names = {param: name for name, param in model.named_parameters()}
    for (param, master), value in zip(pairs, masters):
        problem = tensor_problem(value, master.dtype, master.shape)
        if problem:
            raise RunError(f"{checkpoint_dir}/trainer_state.pt: master weight {names[param]!r} {problem}; "
                           f"{instead_of(checkpoint_dir)}")


def restore_trainer_state(checkpoint_dir, model, optimizer):
    """--resume: the optimizer's and the RNGs' states of checkpoint_dir/trainer_state.pt, each
    checked against this run's settings and parameters before use (a RunError naming the file) ->
    the saved trainer state (step, evals)."""
    saved = load_trainer_state(checkpoint_dir)
    check_optimizer_settings(optimizer, saved["optimizer"], checkpoint_dir)
    check_master_weights(optimizer, model, saved["optimizer"], checkpoint_dir)
    try:
        optimizer.load_state_dict(saved["optimizer"])
        for param in model.parameters():  # load_state_dict checks counts, not shapes
            for name, value in optimizer.state.get(param, {}).items():
                if torch.is_tensor(value) and value.dim() and value.shape != param.shape:
                    raise ValueError(f"{name} {tuple(value.shape)} for a parameter {tuple(param.shape)}")
    except (ValueError, KeyError, RuntimeError, TypeError) as error:
        raise RunError(f"{checkpoint_dir}/trainer_state.pt: its optimizer state does not fit this model "
                       f"({type(error).__name__}); resume from another checkpoint") from None
    try:
        restore_rng(saved["rng"])
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as error:
        raise RunError(f"{checkpoint_dir}/trainer_state.pt: its RNG states are unusable "
                       f"({type(error).__name__}); resume from another checkpoint") from None
    verify_checkpoint(checkpoint_dir, say, saved)  # its files as one set (config, tokenizer, ...): last, so
    # that a damaged file is named by the check that reads it first
    return saved


def memory_options(config, model):
    """The policy with --lora-rank's adapters (fresh, or the resumed checkpoint's) and --gradient-checkpointing."""
    if config.lora_rank:
        with policy_load_errors(config):
            model = load_adapters(model, config.resume, config) if config.resume else \
                add_lora(model, config.lora_rank, config.lora_alpha, config.lora_targets)
    if config.base_dtype == "nf4":  # after the adapters: only the frozen linears are quantized
        quantize_base(model)
    if config.gradient_checkpointing:
        enable_checkpointing(model)
    return model


def set_learning_rate(optimizer, config, step):
    """The step's learning rate: linear warm-up over --warmup-steps, then constant at --lr."""
    for group in optimizer.param_groups:
        group["lr"] = config.lr * min(1.0, step / (config.warmup_steps + 1))
