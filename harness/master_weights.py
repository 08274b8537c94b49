"""--param-dtype bf16: the optimizer's fp32 master copies of weights stored in bf16 (mixed precision's way).

    optimizer = MasterWeights(trained, torch.optim.AdamW, lr=1e-6, weight_decay=0.01)
    loss.backward(); optimizer.step()   # bf16 grads -> fp32 on the masters, the inner AdamW steps them, rounded back

The masters keep the AdamW steps of lr ~1e-6 that rounding a bf16 weight to nearest would drop
(docs/performance.md). --optimizer-offload: state_device="cpu" keeps the masters and moments in CPU
memory, stepping one gradient at a time there; the update is bit for bit AdamW's on fp32 masters.
"""
import torch


class MasterWeights:
    """An optimizer over `params` that keeps an fp32 master of each non-fp32 one and runs `inner_class` (AdamW,
    AdamW8bit) on the masters; fp32 params (LoRA adapters left in fp32, say) are stepped as they are. Exposes what
    the loop and the checkpoint use: param_groups (the lr), state (keyed by the model's params), zero_grad, step,
    state_dict and load_state_dict (the masters saved with the inner state: a resume is exact). state_device="cpu":
    every master (fp32 parameters' too) and the inner optimizer's state on the CPU (--optimizer-offload)."""

    def __init__(self, params, inner_class, state_device=None, **options):
        self.params = list(params)
        self.masters = [p if p.dtype == torch.float32 and state_device is None else
                        p.detach().to(state_device or p.device, torch.float32, copy=True) for p in self.params]
        self.inner = inner_class(self.masters, **options)
        self.param_groups = self.inner.param_groups

    @property
    def state(self):
        return {p: self.inner.state[m] for p, m in zip(self.params, self.masters) if m in self.inner.state}

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None if set_to_none or p.grad is None else p.grad.zero_()

    @torch.no_grad()
    def step(self):
        """One inner step per parameter, each with only its own fp32 gradient (AdamW's state and step count are per
        parameter, and a parameter without a gradient is skipped: the same update as one step over all), so that
        the fp32 gradient and the optimizer's temporaries exist for one tensor at a time, not for the model."""
        fp32 = [p for p, m in zip(self.params, self.masters) if m is p]
        masked = {p: p.grad for p in fp32}
        for p in fp32:  # fp32 parameters: stepped together, last
            p.grad = None
        for p, m in zip(self.params, self.masters):
            if m is not p and p.grad is not None:
                m.grad, p.grad = p.grad.to(m.device, torch.float32), None
                self.inner.step()
                p.copy_(m)  # round to nearest
                m.grad = None
        for p in fp32:
            p.grad = masked[p]
        if any(p.grad is not None for p in fp32):
            self.inner.step()

    def state_dict(self):
        return {"inner": self.inner.state_dict(),
                "masters": [m for p, m in zip(self.params, self.masters) if m is not p]}

    def load_state_dict(self, state):
        masters = [m for p, m in zip(self.params, self.masters) if m is not p]
        if len(state["masters"]) != len(masters):
            raise ValueError(f"{len(state['masters'])} master weights saved for {len(masters)} bf16 parameters")
        self.inner.load_state_dict(state["inner"])
        with torch.no_grad():
            for p, m, saved in zip([p for p, m in zip(self.params, self.masters) if m is not p], masters,
                                   state["masters"]):
                if saved.shape != m.shape:
                    raise ValueError(f"a master weight {tuple(saved.shape)} for a parameter {tuple(m.shape)}")
                m.copy_(saved)
                p.copy_(m)
