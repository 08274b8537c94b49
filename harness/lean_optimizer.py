"""--param-dtype bf16-sr and --step-in-backward: AdamW on bf16 weights with no fp32 master copies, each new weight
stochastically rounded to bf16, optionally stepped inside backward (harness/policy.py's adamw_class builds it).

    optimizer = LeanAdamW(trained, lr=1e-6, weight_decay=0.01, seed=0)                        # --param-dtype bf16-sr
    optimizer = LeanAdamW(trained, lr=1e-6, weight_decay=0.01, seed=0, step_in_backward=True)  # + --step-in-backward
    loss.backward(); optimizer.step()   # step-in-backward: backward already stepped every weight; step() finds none

What each option does and why: docs/performance.md. The step is torch.optim.AdamW's single-tensor
formula in fp32, CHUNK elements at a time, with fp32 or torchao's 8-bit moments; a tensor's rounding
noise is a function of (seed, its index, its step count) alone, so backward's order and step()'s
agree and a resume carries no RNG state. --step-in-backward steps each weight in its
post-accumulate-grad hook (this rests on harness/model.py's non-reentrant checkpointing: a
reentrant one would run a shared weight's hook once per segment); grad_norm() reports the norm the
clip would have read.
"""
import torch

CHUNK = 2**20  # elements stepped at once: ~40 bytes of temporaries each (8-bit moments' requantization the most)
BLOCK = 256  # 8-bit moments: one fp32 scale per block (torchao's)
MIN_8BIT = 4096  # smaller tensors keep fp32 moments (torchao's and bitsandbytes' rule)
KEEP_HIGH = -65536  # 0xFFFF0000 as an int32: the bits a bf16 keeps of an fp32


def stochastic_round_bf16(x, noise):
    """fp32 x, int32 noise uniform in [0, 2**16) of x's shape -> bf16: x's bits plus the noise, the low 16 bits then
    zeroed. A finite x between two bf16 neighbours lo < x < hi (sign-magnitude: toward and away from zero) rounds
    away from zero when the noise carries into bit 16, with probability (x - lo) / (hi - lo): E[round(x)] = x. At the
    top of the range an |x| above the largest bf16 (3.3895e38) rounds to inf with that probability (inf is its
    neighbour); inf and NaN stay inf and NaN (their bits plus noise could become a NaN of another payload, inf, or
    wrap, so they are passed through as they are)."""
    rounded = ((x.view(torch.int32) + noise) & KEEP_HIGH).view(torch.float32).to(torch.bfloat16)  # exact: low bits 0
    return torch.where(torch.isfinite(x), rounded, x.to(torch.bfloat16))


def rounding_generator(device, seed, index, step):
    """The generator of one tensor's rounding noise at one step: seeded by (seed, its index, its step count)."""
    generator = torch.Generator(device=device)
    generator.manual_seed((seed * 0x9E3779B1 + index * 0x85EBCA77 + int(step)) % 2**63)
    return generator


QMAPS = {}  # the 8-bit codes' value tables per device, made once (a copy to a GPU each step would wait on it)


def _qmaps(device):
    if device not in QMAPS:
        from torchao.optim.subclass_8bit import get_qmap_signed, get_qmap_unsigned
        QMAPS[device] = {"exp_avg": torch.tensor(get_qmap_signed(), device=device),
                         "exp_avg_sq": torch.tensor(get_qmap_unsigned(), device=device)}
    return QMAPS[device]


class LeanAdamW:
    """AdamW over `params` in their own dtype: bf16 weights stepped in fp32 and stochastically rounded back (no
    masters), fp32 weights stepped as torch.optim.AdamW does. moments "fp32" or "8bit" (torchao's codes). Exposes
    what the loop and the checkpoint use: param_groups (the lr), state (keyed by the params: step and the two moments
    of the params' shape), zero_grad, step, state_dict and load_state_dict (a resume is exact)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, *, moments="fp32",
                 seed=0, step_in_backward=False):
        if moments not in ("fp32", "8bit"):
            raise ValueError(f"moments must be fp32 or 8bit, got {moments!r}")
        self.params = list(params)
        self.param_groups = [{"params": self.params, "lr": lr, "betas": tuple(betas), "eps": eps,
                              "weight_decay": weight_decay, "moments": moments}]
        self.moments, self.seed = moments, seed
        self.state, self.scales = {}, {}  # scales: 8-bit moments' per-block scales (shapes other than the param's)
        self.index = {p: i for i, p in enumerate(self.params)}
        self.step_in_backward = step_in_backward
        self.squared_norm = torch.zeros(())  # the squares of the gradients stepped in backward since zero_grad
        self.hooks = [p.register_post_accumulate_grad_hook(self._step_in_backward) for p in self.params] \
            if step_in_backward else []

    def _step_in_backward(self, param):
        self.squared_norm = self.squared_norm.to(param.device) + self.step_param(param, squared_norm=True)
        param.grad = None

    def grad_norm(self):
        """The global L2 norm of this optimizer step's gradients: those stepped in backward since zero_grad (with
        step_in_backward), else those held now."""
        if self.step_in_backward:
            return self.squared_norm.sqrt()
        return torch.linalg.vector_norm(torch.stack([p.grad.float().norm() for p in self.params
                                                     if p.grad is not None] or [torch.zeros(())]))

    def zero_grad(self, set_to_none=True):
        self.squared_norm = torch.zeros(())
        for p in self.params:
            p.grad = None if set_to_none or p.grad is None else p.grad.zero_()

    @torch.no_grad()
    def step(self):
        """One AdamW step of every param with a gradient, one tensor at a time, each gradient freed after its step
        (under step_in_backward backward has stepped them all already: nothing is left)."""
        for p in self.params:
            if p.grad is not None:
                self.step_param(p)
                p.grad = None

    def _eight_bit(self, p):
        return self.moments == "8bit" and p.numel() >= MIN_8BIT and p.numel() % BLOCK == 0

    def _init_state(self, p):
        if self._eight_bit(p):  # code 0 of the signed map is -1, not 0: zero moments are codes with scale 0
            self.state[p] = {"step": torch.tensor(0.0), **{k: torch.zeros_like(p, dtype=torch.uint8)
                                                           for k in ("exp_avg", "exp_avg_sq")}}
            self.scales[p] = {k: torch.zeros(p.numel() // BLOCK, device=p.device) for k in ("exp_avg", "exp_avg_sq")}
        else:
            self.state[p] = {"step": torch.tensor(0.0), **{k: torch.zeros_like(p, dtype=torch.float32)
                                                           for k in ("exp_avg", "exp_avg_sq")}}

    @torch.no_grad()
    def step_param(self, p, squared_norm=False):
        """One AdamW step of one tensor from its p.grad (torch's single-tensor formula, in fp32), CHUNK elements at a
        time; bf16 weights stochastically rounded (the noise of rounding_generator). With squared_norm, returns the
        gradient's squared L2 norm, summed over the chunks (fp32)."""
        group = self.param_groups[0]
        lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        if p not in self.state:
            self._init_state(p)
        state, scales = self.state[p], self.scales.get(p)
        state["step"] += 1
        step = state["step"].item()
        step_size, bias_correction2_sqrt = lr / (1 - beta1 ** step), (1 - beta2 ** step) ** 0.5
        weight, grad = p.detach().view(-1), p.grad.reshape(-1)
        moment_flat = {k: state[k].view(-1) for k in ("exp_avg", "exp_avg_sq")}
        if scales is not None:  # 8-bit moments: torchao's codes (optional: imported only here)
            from torchao.optim.quant_utils import quantize_8bit_with_qmap, scale_tensor
            qmaps = _qmaps(p.device)
        generator = rounding_generator(p.device, self.seed, self.index[p], step) if p.dtype == torch.bfloat16 \
            else None
        squares = torch.zeros((), device=p.device) if squared_norm else None
        for start in range(0, weight.numel(), CHUNK):
            part = slice(start, start + CHUNK)
            w, g = weight[part].float(), grad[part].float()  # fp32 weight: a view, stepped in place
            if squares is not None:
                squares += torch.dot(g, g)  # no temporary of the chunk's size
            if scales is None:
                m, v = moment_flat["exp_avg"][part], moment_flat["exp_avg_sq"][part]
            else:
                blocks = slice(start // BLOCK, (start + CHUNK) // BLOCK)
                m, v = ((qmaps[k][moment_flat[k][part].int()].view(-1, BLOCK) * scales[k][blocks].view(-1, 1))
                        .view(-1) for k in ("exp_avg", "exp_avg_sq"))
            if decay != 0:
                w.mul_(1 - lr * decay)
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            w.addcdiv_(m, (v.sqrt() / bias_correction2_sqrt).add_(eps), value=-step_size)
            if scales is not None:
                for k, value in (("exp_avg", m), ("exp_avg_sq", v)):
                    scaled, scale = scale_tensor(value, BLOCK)
                    moment_flat[k][part] = quantize_8bit_with_qmap(scaled, qmaps[k])
                    scales[k][blocks] = scale
            if generator is not None:
                noise = torch.randint(0, 1 << 16, w.shape, generator=generator, dtype=torch.int32, device=w.device)
                weight[part] = stochastic_round_bf16(w, noise)
            elif p.dtype != torch.float32:
                weight[part] = w  # another dtype (fp16): to nearest
            del w, g
        return squares

    def state_dict(self):
        """{"state": {index: step, exp_avg, exp_avg_sq}, "scales": {index: the 8-bit moments' scales},
        "param_groups": torch's layout (params as indices), "seed"}: plain tensors (a weights_only load reads it)."""
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        return {"state": {self.index[p]: dict(s) for p, s in self.state.items()},
                "scales": {self.index[p]: dict(s) for p, s in self.scales.items()},
                "param_groups": [{**group, "params": list(range(len(self.params)))}], "seed": self.seed}

    def load_state_dict(self, saved):
        """state_dict()'s output back; a ValueError when it does not fit these params (count, shape, dtype)."""
        groups, state, scales = saved["param_groups"], saved["state"], saved.get("scales", {})
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.params):
            raise ValueError(f"{len(groups[0]['params']) if groups else 0} saved parameters for {len(self.params)}")
        if groups[0].get("moments") != self.moments:
            raise ValueError(f"saved {groups[0].get('moments')} moments, this optimizer keeps {self.moments}")
        self.state, self.scales = {}, {}
        for index, values in state.items():
            p = self.params[int(index)]
            eight_bit = self._eight_bit(p)
            for k in ("exp_avg", "exp_avg_sq"):
                value = values[k]
                if value.shape != p.shape or value.dtype != (torch.uint8 if eight_bit else torch.float32):
                    raise ValueError(f"{k} {tuple(value.shape)} {value.dtype} for a parameter {tuple(p.shape)}")
                if eight_bit and scales[index][k].shape != (p.numel() // BLOCK,):
                    raise ValueError(f"{k}'s scales {tuple(scales[index][k].shape)} for a parameter {tuple(p.shape)}")
            self.state[p] = {k: v.to(p.device) if k != "step" else v.clone() for k, v in values.items()}
            if eight_bit:
                self.scales[p] = {k: v.to(p.device) for k, v in scales[index].items()}
        self.seed = int(saved["seed"])
        self.param_groups[0].update({k: v for k, v in groups[0].items() if k != "params"})
        self.param_groups[0]["betas"] = tuple(self.param_groups[0]["betas"])
