"""One JSON line per call, from any Ray process, each time a piece of the plug-in runs (VERL_CPU_TRACE=<file>).

It wraps verl's side, never the plug-in (which may be half-imported when this module is loaded):
  - verl's estimator and policy-loss registries: `softmaxgrpo`, `maxrl` and `ar` are wrapped whenever registered;
  - TrainingWorker.set_loss_fn, and the loss it installs (the plug-in's lopti_ppo_loss when Lopti is on);
  - RayPPOTrainer._update_actor, which the plug-in's Lopti trainer calls once per pass.
"""
import functools
import json
import os

import torch

TRACED = ("softmaxgrpo", "maxrl", "ar")


def record(event, **fields):
    path = os.environ.get("VERL_CPU_TRACE")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")


def first_token(values, mask):
    """[B, T] token values -> [B] the value at each row's first response token (outcome values are constant)."""
    return values.gather(1, mask.long().argmax(1, keepdim=True))[:, 0]


def describe_advantages(kwargs, out):
    mask = kwargs["response_mask"]
    return {"uids": [str(uid) for uid in kwargs.get("index")], "scores": kwargs["token_level_rewards"].sum(-1).tolist(),
            "advantages": first_token(out[0], mask).tolist(),
            "finite": bool(torch.isfinite(out[0]).all() and torch.isfinite(kwargs["token_level_rewards"]).all())}


def describe_loss(kwargs, out):
    config = kwargs.get("config")
    return {"alpha": None if config is None else config.policy_loss.get("ar_alpha"), "loss": float(out[0].detach()),
            "tokens": int(kwargs["response_mask"].sum())}


def traced(name, fn):
    if getattr(fn, "_traced", False):
        return fn
    describe = describe_loss if name == "ar" else describe_advantages

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        record(f"registry:{name}", **describe(kwargs, out))
        return out
    wrapper._traced = True
    return wrapper


class TracingRegistry(dict):
    def __setitem__(self, key, value):
        super().__setitem__(key, traced(key, value) if key in TRACED else value)


from verl.trainer.ppo import core_algos  # noqa: E402

for registry_name in ("ADV_ESTIMATOR_REGISTRY", "POLICY_LOSS_REGISTRY"):
    registry = getattr(core_algos, registry_name)
    if not isinstance(registry, TracingRegistry):
        setattr(core_algos, registry_name, TracingRegistry(registry))  # core_algos reads the global at call time
        for key in TRACED:
            if key in registry:
                getattr(core_algos, registry_name)[key] = registry[key]

from verl.workers import engine_workers  # noqa: E402

set_loss_fn = engine_workers.TrainingWorker.set_loss_fn


def set_loss_fn_traced(self, loss_fn):
    inner = getattr(loss_fn, "func", loss_fn)
    name = f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', repr(inner))}"
    record("worker:set_loss_fn", loss_fn=name)

    def loss(*args, **kwargs):
        out = loss_fn(*args, **kwargs)
        data = kwargs.get("data", args[2] if len(args) > 2 else None)
        record("worker:loss_fn", loss_fn=name, loss=float(out[0].detach()),
               has_lopti_kl_mask=bool(data is not None and "lopti_kl_mask" in data.keys()))
        return out
    return set_loss_fn(self, loss)


if not getattr(set_loss_fn, "_traced", False):
    set_loss_fn_traced._traced = True
    engine_workers.TrainingWorker.set_loss_fn = set_loss_fn_traced

from verl.trainer.ppo import ray_trainer  # noqa: E402

update_actor = ray_trainer.RayPPOTrainer._update_actor


def update_actor_traced(self, batch):
    tensors, eta = batch.batch, float(self.config.algorithm.get("lopti_eta", 0.0))
    response_mask = tensors["response_mask"].bool()
    pass_mask = tensors["lopti_kl_mask"].bool() if "lopti_kl_mask" in tensors.keys() else response_mask
    low = response_mask & (tensors["old_log_probs"].exp() < eta)
    record("trainer:update_actor", step=int(getattr(self, "global_steps", -1)), pass_tokens=int(pass_mask.sum()),
           low_tokens_in_pass=int((low & pass_mask).sum()), response_tokens=int(response_mask.sum()),
           nonzero_adv_tokens=int((tensors["advantages"] != 0).sum()))
    return update_actor(self, batch)


if not getattr(update_actor, "_traced", False):
    update_actor_traced._traced = True
    ray_trainer.RayPPOTrainer._update_actor = update_actor_traced
