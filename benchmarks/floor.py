"""The physical floor of each phase of an RL step: the least time its FLOPs and its bytes allow on a device.

    python benchmarks/floor.py --shape qwen2.5-0.5b --gpu H200       # 64 prompts x M 8 x 256 tokens, bf16
    python benchmarks/floor.py --shape smollm2-135m --device cpu --dtype fp32 --prompts 4 -M 4 --prompt-tokens 115

A phase cannot take less than max(FLOPs / peak FLOP rate, bytes moved / peak bandwidth). The counts (a token costs
2 FLOPs per matmul weight, the LM head included even when tied; attention 2 x 2 FLOPs per head dimension for each
(query, key) pair; the backward twice the forward):
  prefill       each distinct prompt once, all but its last token (the least work: generate
                prefills each of its M rows): the body's matmuls and attention; bytes: the
                weights once, the KV cache written.
  decode        per step t, only the rows still running (a finished row is not decoded): FLOPs of one token per row
                (body + LM head + attention over its context) against bytes of the weights + every running row's
                KV cache read; the step's floor is the larger of the two, summed over t.
  forwards      the no-grad log-prob forwards (pi_old, a reference model): each distinct prompt of the forwarded
                rows once (the least work: token_logprobs runs each row whole), then each
                row's completion tokens (LM head on those only).
  fwd+bwd       the same count x 3 for every forward that trains (each micro-batch of each Lopti pass); bytes: the
                weights read three times. The update's LM head is float32
                (rollout.chunk_logprobs): its FLOPs count at TF32 tensor cores' rate, half the
                16-bit one, so twice under bf16 (HEAD_COST); its recompute in the backward
                (several logit chunks) is left out.
  optimizer     bytes: AdamW reads parameter, gradient, both moments and writes parameter and moments, fp32 each
                (28 bytes per parameter per optimizer step; fused on CUDA: one pass, no per-tensor launches).
Left out (a floor may only leave work out): norms, rotary, softmax and other elementwise work, activations' traffic,
the loss, gradient clipping, rewards (no floor: Python on the host). Tokens are the real ones (no padding), as the
run sampled them. Peaks: a short probe on this machine (the best rate of a few square matmuls at the dtype, a big
tensor copy counted as read + write), or KNOWN_GPUS, overridable. What the benchmarks measure goes next to it with
format_report (measured s, floor s, ratio, the step's total); recorded() collects a step's shapes as it runs.
"""
import argparse
import contextlib
import dataclasses
import re
import os
import statistics
import sys
import time
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere
from harness.memory import GPU_PEAKS  # noqa: E402

# --- Clocks: a phase's wall time, queued CUDA work included -----------------------------------------------------------
def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def timed(seconds, device, name):
    """Adds the block's wall time to seconds[name]; synchronises CUDA on both ends so queued GPU work counts."""
    sync(device)
    start = time.perf_counter()
    with torch.profiler.record_function(name):
        yield
    sync(device)
    seconds[name] += time.perf_counter() - start


# --- The shape: what one token costs -------------------------------------------------------------------------------
KNOWN_SHAPES = {  # from the models' config.json (nothing downloads): hidden, layers, heads, kv heads, MLP, vocab
    "qwen2.5-0.5b": dict(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936, tied=True,
                         qkv_bias=True),
    "qwen2.5-1.5b": dict(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab=151936, tied=True,
                         qkv_bias=True),
    "qwen2.5-3b": dict(hidden=2048, layers=36, heads=16, kv_heads=2, intermediate=11008, vocab=151936, tied=True,
                       qkv_bias=True),
    "smollm2-135m": dict(hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536, vocab=49152, tied=True),
}
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclasses.dataclass(frozen=True)
class Shape:
    """A Llama/Qwen-style decoder: per layer q, k, v, o projections and a gated MLP (gate, up, down)."""
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool = True
    qkv_bias: bool = False
    head_dim: int | None = None  # None: hidden // heads

    @property
    def dim(self):
        return self.head_dim or self.hidden // self.heads

    @property
    def layer_matmul_params(self):
        """Matmul weights of one layer: q and o (hidden x heads*dim), k and v (hidden x kv_heads*dim), MLP 3 x H x I."""
        return (2 * self.hidden * self.heads * self.dim + 2 * self.hidden * self.kv_heads * self.dim
                + 3 * self.hidden * self.intermediate)

    @property
    def body_matmul_params(self):
        return self.layers * self.layer_matmul_params

    @property
    def head_params(self):  # the LM head runs whether or not it shares the embedding's matrix
        return self.vocab * self.hidden

    @property
    def params(self):
        """Every parameter (what AdamW updates): embedding, layers with their norms and biases, untied head."""
        bias = (self.heads + 2 * self.kv_heads) * self.dim if self.qkv_bias else 0
        per_layer = self.layer_matmul_params + bias + 2 * self.hidden  # + the two RMSNorm weights
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.layers * per_layer + self.hidden

    def kv_bytes_per_token(self, dtype_bytes):
        """Keys and values of one position in every layer."""
        return 2 * self.layers * self.kv_heads * self.dim * dtype_bytes

    def attention_flops(self, keys):
        """QK^T and attention x V over `keys` (query, key) pairs in all (2 FLOPs per multiply-add)."""
        return 4 * self.layers * self.heads * self.dim * keys


def causal_keys(queries, first):
    """(query, key) pairs of `queries` consecutive positions under a causal mask, the first seeing `first` keys."""
    return queries * first + queries * (queries - 1) // 2


def shape_of(config):
    """Shape of an HF model config (Llama, Qwen2, SmolLM2, the tiny model), or of a KNOWN_SHAPES name."""
    if isinstance(config, str):
        return Shape(**KNOWN_SHAPES[config])
    config = config.get_text_config()
    return Shape(hidden=config.hidden_size, layers=config.num_hidden_layers, heads=config.num_attention_heads,
                 kv_heads=config.num_key_value_heads or config.num_attention_heads,
                 intermediate=config.intermediate_size, vocab=config.vocab_size,
                 tied=bool(config.tie_word_embeddings),
                 qkv_bias=bool(getattr(config, "attention_bias", False) or config.model_type == "qwen2"),
                 head_dim=getattr(config, "head_dim", None))


# --- Peaks: a probe, or the table ----------------------------------------------------------------------------------
KNOWN_GPUS = {  # the vendors' datasheet peaks: harness/memory.py's table (its plan's step time too), the H100's PCIe
    # and NVL cards first (typed from NVIDIA's H100 datasheet, its sparse figures halved; not the lent SXM card)
    "H100 PCIe": dict(bf16=756e12, fp16=756e12, fp32=51e12, bandwidth=2.0e12),
    "H100 NVL": dict(bf16=835e12, fp16=835e12, fp32=60e12, bandwidth=3.9e12), **GPU_PEAKS}


@dataclasses.dataclass(frozen=True)
class Peaks:
    flops: float       # FLOP/s at the compute dtype
    bandwidth: float   # bytes/s
    source: str        # where they come from, printed with the report

    def floor(self, flops, bytes_moved):
        return max(flops / self.flops, bytes_moved / self.bandwidth)


def memory_mib(device):
    """(peak, current) MiB: the CUDA allocator on GPU, else this process's VmHWM / VmRSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, torch.cuda.memory_allocated(device) / 2**20
    with open("/proc/self/status") as f:  # Linux only (elsewhere: resource.getrusage(...).ru_maxrss is the peak)
        fields = {line.split(":")[0]: int(line.split()[1]) for line in f if line.startswith(("VmHWM", "VmRSS"))}
    return fields["VmHWM"] / 1024, fields["VmRSS"] / 1024


def known_gpu(name):
    """The KNOWN_GPUS key in a device name ("NVIDIA H200" -> "H200"), or None."""
    for key in KNOWN_GPUS:
        if re.search(rf"(^|\s){re.escape(key)}(\s|$|-)", name):
            return key
    return None


def best_seconds(fn, device, repeats):
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def probe(device, dtype="fp32", *, sizes=None, copy_mib=None, repeats=8):
    """Peaks measured here: the best rate of `repeats` square matmuls at `dtype` over a few `sizes` (a CPU's best
    is not always the largest), and the best of copies of a `copy_mib` MiB tensor (read + write). On a CPU they
    run on torch's current thread count; on a shared machine the load lowers them (the floor then too)."""
    device = torch.device(device)
    sizes = sizes or ((4096, 8192) if device.type == "cuda" else (128, 256, 512, 1024))
    copy_mib = copy_mib or (1024 if device.type == "cuda" else 256)
    torch_dtype = TORCH_DTYPES[dtype]
    flops = 0.0
    for size in sizes:  # as many repeats of a small size as of the largest one's FLOPs: a fair chance at the best
        a, b = (torch.randn(size, size, device=device, dtype=torch_dtype) for _ in range(2))
        count = repeats * max(1, (sizes[-1] // size) ** 3 // 8)
        flops = max(flops, 2 * size ** 3 / best_seconds(lambda: a @ b, device, count))
    source = torch.empty(copy_mib * 2**20 // 4, device=device)
    target = torch.empty_like(source)
    bandwidth = 2 * source.numel() * 4 / best_seconds(lambda: target.copy_(source), device, repeats)
    threads = "" if device.type == "cuda" else f", {torch.get_num_threads()} thread(s)"
    del a, b, source, target
    forget_peak_memory(device)
    return Peaks(flops, bandwidth, f"probe on {device.type}{threads}: best {dtype} matmul of "
                                   f"{'/'.join(map(str, sizes))}^3, {copy_mib} MiB copy")


def matmul_rate(device, dtype, rows, inner, outer, repeats=5):
    """FLOP/s of [rows, inner] @ [inner, outer] here: what the model's own widths reach against the probe's peak."""
    torch_dtype = TORCH_DTYPES[dtype]
    a = torch.randn(rows, inner, device=device, dtype=torch_dtype)
    b = torch.randn(inner, outer, device=device, dtype=torch_dtype)
    return 2 * rows * inner * outer / best_seconds(lambda: a @ b, torch.device(device), repeats)


def width_rates(shape, device, dtype, peaks, *, decode_rows, train_tokens):
    """One line: the MLP's up-projection at the decode batch and at a training micro-batch's tokens, against peak."""
    parts = []
    for what, rows in (("decode", decode_rows), ("training", train_tokens)):
        rate = matmul_rate(device, dtype, rows, shape.hidden, shape.intermediate)
        parts.append(f"{what} [{rows} x {shape.hidden}] @ [{shape.hidden} x {shape.intermediate}] "
                     f"{rate / 1e9:.0f} GFLOP/s ({rate / peaks.flops:.0%} of the peak)")
    return "matmul rate at the model's width: " + "; ".join(parts)


def decode_costs(shape, device, dtype, peaks, *, rows, budget_mib=256):
    """One line: why a decode step stays above its bytes floor, measured at the model's own shapes.

    (1) The layer matmuls at `rows` rows over distinct weight tensors (the layers' q, k, v, o, gate, up, down, as many
    layers as fit in `budget_mib`, so that they come from memory as in decode, not from the cache): the rate their
    weights are read at, against the probe's bandwidth. (2) Sampling one token per row from the vocabulary
    (torch.multinomial over softmax, as generate does each step) against one token's bytes floor."""
    device = torch.device(device)
    torch_dtype = TORCH_DTYPES[dtype]
    nbytes = DTYPE_BYTES[dtype]
    outs = [shape.heads * shape.dim, shape.kv_heads * shape.dim, shape.kv_heads * shape.dim, shape.hidden]
    layer = [(o, shape.hidden) for o in outs[:3]] + [(shape.hidden, shape.heads * shape.dim)] + \
        [(shape.intermediate, shape.hidden)] * 2 + [(shape.hidden, shape.intermediate)]
    per_layer = sum(o * i for o, i in layer) * nbytes
    count = max(1, min(shape.layers, int(budget_mib * 2**20 // per_layer)))
    weights = [torch.randn(o, i, device=device, dtype=torch_dtype) for _ in range(count) for o, i in layer]
    inputs = {i: torch.randn(rows, i, device=device, dtype=torch_dtype) for _, i in layer}
    read = count * per_layer / best_seconds(
        lambda: [torch.nn.functional.linear(inputs[w.shape[1]], w) for w in weights], device, 3)
    logits = torch.randn(rows, shape.vocab, device=device)
    sampling = best_seconds(lambda: torch.multinomial(torch.softmax(logits, dim=-1), 1), device, 5)
    token_floor = (shape.body_matmul_params + shape.head_params) * nbytes / peaks.bandwidth
    del weights, inputs, logits
    forget_peak_memory(device)
    return (f"decode at {rows} rows: the layer matmuls read their weights at {read / 1e9:.1f} GB/s "
            f"({read / peaks.bandwidth:.0%} of the probe's bandwidth; {count} layers' worth, from memory); "
            f"sampling a token per row over {shape.vocab} ids {sampling * 1e3:.1f} ms "
            f"({sampling / token_floor:.0%} of a token's bytes floor)")


def forget_peak_memory(device):
    """Reset the peak-memory mark the probe raised (CUDA's allocator peak; VmHWM on Linux), so that a benchmark's
    peak memory stays its own."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # Linux: reset VmHWM to the current RSS
    except OSError:
        pass


def peaks_for(device, dtype, *, gpu=None, tflops=None, gbps=None):
    """Peaks for a run: a KNOWN_GPUS row (given, or the CUDA device's name), else the probe; tflops / gbps win."""
    device = torch.device(device)
    name = gpu or (known_gpu(torch.cuda.get_device_name(device)) if device.type == "cuda" else None)
    if name is not None:
        row = KNOWN_GPUS[name]
        peaks = Peaks(row[dtype], row["bandwidth"], f"{name} datasheet, {dtype} dense")
    elif tflops and gbps:
        return Peaks(tflops * 1e12, gbps * 1e9, "given")
    else:
        peaks = probe(device, dtype)
    if tflops or gbps:
        peaks = Peaks(tflops * 1e12 if tflops else peaks.flops, gbps * 1e9 if gbps else peaks.bandwidth,
                      peaks.source + " (overridden)")
    return peaks


# --- The step's shapes as sampled ----------------------------------------------------------------------------------
@dataclasses.dataclass
class Forward:
    """One log-prob forward: the real lengths of its distinct prompts, of each row's prompt and completion."""
    prompt_lengths: list
    row_prompt_lengths: list
    completion_lengths: list
    trains: bool  # with a backward


@dataclasses.dataclass
class Workload:
    prompt_lengths: list       # [G] real tokens of each distinct prompt
    completion_lengths: list   # [G*M] tokens each row generated (to its EOS, or all max_new_tokens)
    forwards: list = dataclasses.field(default_factory=list)  # every log-prob forward of the update
    optimizer_steps: int = 1
    dtype: str = "fp32"        # the compute dtype: weights and KV cache read at its width

    @property
    def M(self):
        return len(self.completion_lengths) // len(self.prompt_lengths)


def forward_of(attention_mask, completion_mask, trains):
    """Forward of rows given as token_logprobs sees them: attention_mask [b, P+T], completion_mask [b, T]."""
    width = completion_mask.shape[1]
    prompts = attention_mask[:, :-width]
    distinct = torch.unique(prompts, dim=0)  # rows with the same prompt (and padding) share its forward
    return Forward(distinct.sum(1).tolist(), prompts.sum(1).tolist(), completion_mask.sum(1).long().tolist(), trains)


def rollout_lengths(rollouts, M):
    """(prompt lengths [G], completion lengths [G*M]) of a rollout.Rollouts: rows to their EOS; a truncated row
    ran every column (its mask may be zeroed by mask_truncated, its decoding was not)."""
    width = rollouts.completion_mask.shape[1]
    prompts = rollouts.attention_mask[::M, :-width].sum(1).tolist()
    generated = torch.where(rollouts.truncated, width, rollouts.completion_mask.sum(1).long())
    return prompts, generated.tolist()


# --- The floors --------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Floor:
    seconds: float
    flops: float
    bytes: float
    bound: str  # "FLOPs" or "bytes": the term that sets the floor (decode: in most of its steps)


def floor_of(flops, bytes_moved, peaks):
    bound = "FLOPs" if flops / peaks.flops >= bytes_moved / peaks.bandwidth else "bytes"
    return Floor(peaks.floor(flops, bytes_moved), flops, bytes_moved, bound)


def prefill_floor(shape, work, peaks):
    """Each distinct prompt once, all but its last token (generate's first decode step feeds that one)."""
    b = DTYPE_BYTES[work.dtype]
    tokens = [p - 1 for p in work.prompt_lengths]
    flops = sum(2 * shape.body_matmul_params * n + shape.attention_flops(causal_keys(n, 1)) for n in tokens)
    bytes_moved = (shape.body_matmul_params * b + sum(tokens) * shape.kv_bytes_per_token(b))
    return floor_of(flops, bytes_moved, peaks)


def decode_floor(shape, work, peaks):
    """Sum over decode steps t of max(FLOPs, bytes) of the rows still running at t."""
    b = DTYPE_BYTES[work.dtype]
    contexts = [p for p in work.prompt_lengths for _ in range(work.M)]  # a row's prompt length
    per_token = 2 * (shape.body_matmul_params + shape.head_params)
    weights = (shape.body_matmul_params + shape.head_params) * b
    seconds, flops, bytes_moved, flop_bound_steps, steps = 0.0, 0.0, 0.0, 0, max(work.completion_lengths, default=0)
    for t in range(steps):
        running = [c for c, n in zip(contexts, work.completion_lengths) if n > t]
        context = sum(running) + t * len(running)  # keys each running row attends to (prompt + t generated)
        step_flops = per_token * len(running) + shape.attention_flops(context)
        step_bytes = weights + context * shape.kv_bytes_per_token(b)
        seconds += peaks.floor(step_flops, step_bytes)
        flops, bytes_moved = flops + step_flops, bytes_moved + step_bytes
        flop_bound_steps += step_flops / peaks.flops >= step_bytes / peaks.bandwidth
    return Floor(seconds, flops, bytes_moved, "FLOPs" if 2 * flop_bound_steps > steps else "bytes")


# The update's LM head runs in float32 (rollout.chunk_logprobs: IEEE float32 unless TF32 is
# allowed). Its floor takes the fastest float32 a card offers, TF32 tensor cores, half the 16-bit
# tensor-core rate on the KNOWN_GPUS: its FLOPs count twice at a bf16/fp16 peak; in an fp32 run as
# the body's. The recompute of its logits in the backward (several logit chunks under autograd) is
# work a floor leaves out.
HEAD_COST = {"bf16": 2, "fp16": 2, "fp32": 1}


def forward_flops(shape, forward, head_cost=1):
    """One forward: each distinct prompt but its last token once (the least work), then each row's
    completion positions (prompt's last token .. the completion's last but one) through body + LM head (the head's
    FLOPs times head_cost: HEAD_COST)."""
    prompt = sum(2 * shape.body_matmul_params * (p - 1) + shape.attention_flops(causal_keys(p - 1, 1))
                 for p in forward.prompt_lengths)
    completion = sum(2 * (shape.body_matmul_params + head_cost * shape.head_params) * n
                     + shape.attention_flops(causal_keys(n, p))
                     for p, n in zip(forward.row_prompt_lengths, forward.completion_lengths))
    return prompt + completion


def forwards_floor(shape, work, peaks, trains):
    """All no-grad forwards (trains=False) or all forward+backward passes (trains=True, x 3) of the update."""
    b = DTYPE_BYTES[work.dtype]
    chosen = [f for f in work.forwards if f.trains == trains]
    factor = 3 if trains else 1  # the backward: gradients of the inputs and of the weights, a forward's FLOPs each
    flops = factor * sum(forward_flops(shape, f, HEAD_COST[work.dtype]) for f in chosen)
    bytes_moved = factor * len(chosen) * (shape.body_matmul_params + shape.head_params) * b  # weights per pass
    return floor_of(flops, bytes_moved, peaks)


def optimizer_floor(shape, work, peaks):
    return floor_of(0.0, work.optimizer_steps * 28 * shape.params, peaks)


def step_floors(shape, work, peaks):
    """{phase: Floor} of one step, the phases of PHASES."""
    return {"prefill": prefill_floor(shape, work, peaks), "decode": decode_floor(shape, work, peaks),
            "no-grad forwards": forwards_floor(shape, work, peaks, trains=False),
            "forward+backward": forwards_floor(shape, work, peaks, trains=True),
            "optimizer step": optimizer_floor(shape, work, peaks)}


# --- The report ----------------------------------------------------------------------------------------------------
PHASES = (("rollout", ("prefill", "decode")), ("reward+advantage", ()), ("no-grad forwards", ("no-grad forwards",)),
          ("update", ("forward+backward", "optimizer step")))  # the step's phases and the floors they add up


def report_rows(measured, floors):
    """-> [(name, measured s or None, floor s or None, bound)]: each phase, its parts indented, then the step.

    measured: {name: seconds} for any of the phase or part names (a part measured alone gets its own ratio)."""
    rows, total_measured, total_floor = [], None, 0.0
    for phase, parts in PHASES:
        floor = sum(floors[p].seconds for p in parts) if parts else None
        if phase == "no-grad forwards" and not floors[phase].flops:
            continue  # none ran (one pass: pi_old is each forward's own detached log-probs)
        rows.append((phase, measured.get(phase), floor, floors[parts[0]].bound if len(parts) == 1 else ""))
        if measured.get(phase) is not None:
            total_measured = (total_measured or 0.0) + measured[phase]
        total_floor += floor or 0.0
        if len(parts) > 1:
            rows += [("  " + p, measured.get(p), floors[p].seconds, floors[p].bound) for p in parts]
    rows.append(("step", total_measured, total_floor, ""))
    return rows


def format_report(measured, floors, peaks, title="floor"):
    """The table: phase, measured s, floor s, measured / floor, the binding term; then the peaks used."""
    lines = [f"{title:40s} {'measured s':>11s} {'floor s':>10s} {'ratio':>8s}  bound"]
    for name, seconds, floor, bound in report_rows(measured, floors):
        ratio = f"{seconds / floor:8.1f}" if seconds is not None and floor else f"{'-':>8s}"
        shown = f"{seconds:11.4f}" if seconds is not None else f"{'-':>11s}"
        floor_shown = f"{floor:10.4f}" if floor is not None else f"{'-':>10s}"
        lines.append(f"{name:40s} {shown} {floor_shown} {ratio}  {bound}")
    lines.append(f"peaks: {peaks.flops / 1e12:.3f} TFLOP/s, {peaks.bandwidth / 1e9:.1f} GB/s ({peaks.source})")
    return "\n".join(lines)


# --- What a benchmark step records -----------------------------------------------------------------------------------
@contextlib.contextmanager
def recorded(clock, optimizer):
    """Record one step's forwards (and time its pieces) while train.py's functions run unchanged.

    Yields a dict: "forwards" (a Forward per token_logprobs call of train.update_batch, the update a benchmark
    step runs), "optimizer steps". clock(name) times "no-grad forwards" and "optimizer step". The
    rollout's prefill is inside its generate call: prefill_seconds times it apart."""
    import train

    record = defaultdict(list)
    token_logprobs, step = train.token_logprobs, optimizer.step

    def recording_logprobs(model, input_ids, attention_mask, completion_mask, **kwargs):
        trains = torch.is_grad_enabled()
        record["forwards"].append(forward_of(attention_mask, completion_mask, trains))
        with contextlib.nullcontext() if trains else clock("no-grad forwards"):
            return token_logprobs(model, input_ids, attention_mask, completion_mask, **kwargs)

    def timed_step(*args, **kwargs):
        record["optimizer steps"].append(1)
        with clock("optimizer step"):
            return step(*args, **kwargs)

    own_step = "step" in vars(optimizer)
    train.token_logprobs, optimizer.step = recording_logprobs, timed_step
    try:
        yield record
    finally:
        train.token_logprobs = token_logprobs
        if own_step:
            optimizer.step = step
        else:
            del optimizer.step  # the class's own method again


def prefill_seconds(model, rollouts, dtype):
    """Seconds of a rollout's prefill, timed apart (generate runs it inside its call): one no-grad
    forward of the rows' prompts into a KV cache, the last position's logits only (generate's
    first forward), under --dtype's precision. Hooks on the model would sit inside a compiled
    forward (HF's static path)."""
    from rollout import precision
    width, device = rollouts.completion_mask.shape[1], next(model.parameters()).device
    ids, mask = (t[:, :-width].to(device) for t in (rollouts.input_ids, rollouts.attention_mask))
    seconds = defaultdict(float)
    with torch.no_grad(), precision(device, dtype), timed(seconds, device, "prefill"):
        model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0),
              use_cache=True, logits_to_keep=1)
    return seconds["prefill"]


def measured_phases(seconds):
    """The report's measured phases from one step's clock: "rollout", "reward+advantage", "update_policy" (the
    whole call), what recorded() timed inside them ("no-grad forwards", "optimizer step") and
    "prefill" (prefill_seconds: then decode is the rollout less it)."""
    no_grad = seconds.get("no-grad forwards", 0.0)
    update = seconds["update_policy"] - no_grad
    measured = {"rollout": seconds["rollout"], "reward+advantage": seconds.get("reward+advantage"),
                "no-grad forwards": no_grad, "update": update,
                "forward+backward": update - seconds.get("optimizer step", 0.0),  # + loss, clip: small
                "optimizer step": seconds.get("optimizer step")}
    if "prefill" in seconds:
        measured.update(prefill=seconds["prefill"], decode=seconds["rollout"] - seconds["prefill"])
    return measured


def median_phases(steps):
    """{name: median over steps} of a list of {name: seconds} (a name missing from a step is left out there)."""
    names = {name for step in steps for name in step}
    return {name: statistics.median([s[name] for s in steps if s.get(name) is not None])
            for name in names if any(s.get(name) is not None for s in steps)}


def median_floors(steps):
    """{phase: Floor} with each phase's median seconds over a list of step_floors results (its bound: that step's)."""
    result = {}
    for phase in steps[0]:
        ordered = sorted((floors[phase] for floors in steps), key=lambda f: f.seconds)
        result[phase] = ordered[(len(ordered) - 1) // 2]
    return result


def workload_of(rollouts, M, record, dtype):
    prompts, completions = rollout_lengths(rollouts, M)
    return Workload(prompts, completions, forwards=record["forwards"],
                    optimizer_steps=len(record["optimizer steps"]), dtype=dtype)


# --- The floor alone, for a shape and a workload given on the command line ------------------------------------------
def uniform_workload(prompts, M, prompt_tokens, completion_tokens, dtype, passes=1, micro_batch=16, pi_old=False):
    """Every prompt `prompt_tokens` long, every row `completion_tokens`, every row trained in each pass."""
    rows = prompts * M
    chunks = [min(micro_batch, rows - start) for start in range(0, rows, micro_batch)]
    groups = [-(-n // M) for n in chunks]  # distinct prompts per micro-batch (groups are adjacent rows)
    def forwards(trains):
        return [Forward([prompt_tokens] * g, [prompt_tokens] * n, [completion_tokens] * n, trains)
                for g, n in zip(groups, chunks)]
    trains, no_grad = forwards(True) * passes, forwards(False)
    return Workload([prompt_tokens] * prompts, [completion_tokens] * rows, forwards=trains + no_grad * pi_old,
                    optimizer_steps=passes, dtype=dtype)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted(KNOWN_SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--gpu", choices=sorted(KNOWN_GPUS), default=None, help="datasheet peaks (default: probe here)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="for the probe")
    p.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bf16")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("-M", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--completion-tokens", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--lopti", action="store_true", help="two passes and a pi_old forward (AR + Lopti)")
    args = p.parse_args(argv)
    shape = shape_of(args.shape)
    peaks = peaks_for(args.device, args.dtype, gpu=args.gpu)
    work = uniform_workload(args.prompts, args.M, args.prompt_tokens, args.completion_tokens, args.dtype,
                            passes=2 if args.lopti else 1, micro_batch=args.micro_batch, pi_old=args.lopti)
    print(f"{args.shape}: {shape.params / 1e6:.0f}M params | {args.prompts} prompts x M {args.M} | prompt "
          f"{args.prompt_tokens}, completion {args.completion_tokens} tokens | {args.dtype}")
    print(format_report({}, step_floors(shape, work, peaks), peaks, title=f"floor ({args.shape})"))


if __name__ == "__main__":
    main()
