"""SoftmaxGRPO, MaxRL, Advantage Reweighting (AR) and Lopti as a plug-in for verl 0.9.x (multi-GPU, multi-node).

The formulas are not copied here: the estimators call softmax_grpo.group_advantages and the policy loss calls
lopti.reweight_advantages, then verl's own clipped loss. Copy this file next to softmax_grpo.py and lopti.py.

Use from verl's own launcher (advantage estimators and the AR loss only):

    VERL_USE_EXTERNAL_MODULES=integrations.verl_plugin python -m verl.trainer.main_ppo \\
        algorithm.adv_estimator=softmaxgrpo +algorithm.softmaxgrpo_tau=0.1 ...

or from this file's entry point, which adds Lopti (two actor updates per batch) and does the wiring below:

    python -m integrations.verl_plugin algorithm.adv_estimator=grpo +algorithm.lopti_eta=0.5 \\
        actor_rollout_ref.actor.policy_loss.loss_mode=ar +actor_rollout_ref.actor.policy_loss.ar_alpha=0.3 ...

The config keys (the `+` adds a key verl's yaml does not declare) and what each piece does:
docs/scale-out.md, "verl". verl must be able to import this module in every process: run from the
repository root or put it on PYTHONPATH.
"""
import importlib
import os
import sys
from collections import defaultdict
from dataclasses import dataclass
from functools import partial
from typing import Optional

if __name__ == "__main__":
    # `python -m integrations.verl_plugin ...`: run main() of the importable module instead of this __main__ copy, so
    # verl's registries and hydra's `_target_` lookup see one copy of the functions below.
    sys.exit(importlib.import_module(__spec__.name if __spec__ else os.path.basename(__file__)[:-3]).main())


def import_verl_in_order():
    """Import verl so that the modules verl loads from VERL_USE_EXTERNAL_MODULES keep their listed order around
    this one. Imported first in a fresh Ray worker, this module would otherwise have verl load every listed module
    while it is itself half-imported, and a module listed after it could not use its names at import time. So the
    modules listed before this one load now (verl imports them), those after it once this module is complete.
    -> the names to import at the end of this module."""
    listed = os.environ.get("VERL_USE_EXTERNAL_MODULES", "")
    names = [name.strip() for name in listed.split(",") if name.strip()]
    if "verl" in sys.modules or __name__ not in names:
        return []
    os.environ["VERL_USE_EXTERNAL_MODULES"] = ",".join(names[:names.index(__name__)])
    try:
        import verl  # noqa: F401
    finally:
        os.environ["VERL_USE_EXTERNAL_MODULES"] = listed
    return names[names.index(__name__) + 1:]


LISTED_AFTER_THIS_MODULE = import_verl_in_order()

import ray  # noqa: E402
import torch  # noqa: E402

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root, from anywhere
from lopti import lopti_passes, reweight_advantages  # noqa: E402
from softmax_grpo import group_advantages  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import (  # noqa: E402
    agg_loss, get_policy_loss_fn, kl_penalty, register_adv_est, register_policy_loss)
from verl.trainer.ppo.ray_trainer import RayPPOTrainer  # noqa: E402
from verl.utils.metric import Metric  # noqa: E402
from verl.workers.config import PolicyLossConfig  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402
from verl.workers.utils.padding import no_padding_2_padding  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# Advantage estimators: verl hands over flat rows; our group_advantages wants [G, M]
def grouped_advantages(scores, index, method, **options):
    """Per-row advantages [B] from scores [B] and one group id per row (verl's `uid`), rows in any order.

    Groups may be interleaved (batch balancing reorders rows) and of unequal sizes (filtering drops rows): rows are
    gathered by id, groups of equal size go through one group_advantages call as a [G, M] tensor, and a group of one
    gets advantage 0 (no baseline). options: group_advantages' keywords (tau=...).
    """
    if len(index) != len(scores):
        raise ValueError(f"need one group id per row: {len(index)} ids for {len(scores)} rows")
    rows_by_id = defaultdict(list)
    for row, group_id in enumerate(index):
        rows_by_id[group_id].append(row)
    groups_by_size = defaultdict(list)
    for rows in rows_by_id.values():
        groups_by_size[len(rows)].append(rows)
    advantages = torch.zeros(len(scores), dtype=torch.float32, device=scores.device)
    for size, groups in groups_by_size.items():
        if size < 2:
            continue  # a prompt with one completion has no baseline: its advantage stays 0
        rows = torch.tensor(groups, device=scores.device)  # [G, size]
        advantages[rows] = group_advantages(scores[rows], method, **options)
    return advantages


def outcome_advantages(token_level_rewards, response_mask, index, method, **options):
    """verl estimator body: sequence reward = sum of the row's token rewards, advantage broadcast over its tokens."""
    if index is None:
        raise ValueError(f"the {method} estimator needs a prompt uid per row (DataProto.non_tensor_batch['uid'])")
    scores = (token_level_rewards * response_mask).sum(dim=-1)  # padding carries no reward
    advantages = grouped_advantages(scores, index, method, **options).to(token_level_rewards.dtype)
    token_advantages = advantages[:, None] * response_mask
    return token_advantages, token_advantages  # (advantages, returns), as every verl outcome estimator


@register_adv_est("softmaxgrpo")
def compute_softmaxgrpo_advantage(token_level_rewards, response_mask, index=None, config=None, **_):
    """SoftmaxGRPO: A = M * softmax(R / tau) - 1 per prompt, tau = algorithm.softmaxgrpo_tau. Returns [B, T] twice."""
    tau = config.get("softmaxgrpo_tau") if config is not None else None
    if tau is None:
        raise ValueError("adv_estimator=softmaxgrpo needs algorithm.softmaxgrpo_tau, e.g. +algorithm.softmaxgrpo_tau=0.1")
    return outcome_advantages(token_level_rewards, response_mask, index, "softmax", tau=tau)


@register_adv_est("maxrl")
def compute_maxrl_advantage(token_level_rewards, response_mask, index=None, config=None, **_):
    """MaxRL: A = R / mean(R) - 1 per prompt (rewards >= 0; 0 when every completion failed). Returns [B, T] twice."""
    return outcome_advantages(token_level_rewards, response_mask, index, "maxrl")


# Advantage Reweighting as a verl policy loss
@dataclass
class ARPolicyLossConfig(PolicyLossConfig):
    """verl's PolicyLossConfig plus AR's alpha: verl's config dataclasses reject keys they do not declare, so
    `ar_alpha` needs `actor_rollout_ref.actor.policy_loss._target_=integrations.verl_plugin.ARPolicyLossConfig`
    (main() below sets it whenever loss_mode=ar)."""

    ar_alpha: Optional[float] = None


@register_policy_loss("ar")
def compute_policy_loss_ar(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                           config=None, rollout_is_weights=None):
    """AR: advantages [B, T] scaled by alpha * exp(old_log_prob) + 1 - alpha, then verl's "vanilla" clipped loss
    (clip_ratio_low/high, dual clip clip_ratio_c, loss_agg_mode) with the same arguments. -> (loss, metrics)."""
    alpha = config.policy_loss.get("ar_alpha") if config is not None else None
    if alpha is None:
        raise ValueError("policy_loss.loss_mode=ar needs actor_rollout_ref.actor.policy_loss.ar_alpha (paper: 0.3 with "
                         "Lopti, 0.2 alone); launch with `python -m integrations.verl_plugin` or set its _target_")
    token_advantages = reweight_advantages(advantages, old_log_prob.exp(), response_mask, float(alpha))
    return get_policy_loss_fn("vanilla")(
        old_log_prob=old_log_prob, log_prob=log_prob, advantages=token_advantages.to(advantages.dtype),
        response_mask=response_mask, loss_agg_mode=loss_agg_mode, config=config, rollout_is_weights=rollout_is_weights)


# Lopti: two actor updates per batch
def lopti_ppo_loss(config, model_output, data, dp_group=None):
    """verl's actor loss (workers/utils/losses.ppo_loss) with the KL term restricted to one Lopti pass.

    The pass's tokens arrive as data["lopti_kl_mask"] [B, T]. The KL of the other valid tokens is aggregated exactly
    as verl aggregates its KL term (same loss_agg_mode, same full response_mask, same global token count) and
    subtracted, so what is left is the pass's KL over the full-mask denominator. Without a KL loss or a mask this is
    ppo_loss unchanged. The entropy bonus (0 in both papers) is not masked.
    """
    loss, metrics = ppo_loss(config, model_output, data, dp_group)
    if not config.use_kl_loss or "lopti_kl_mask" not in data.keys():
        return loss, metrics
    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    padded = data.select("response_mask", "ref_log_prob", "lopti_kl_mask").to_padded_tensor()
    response_mask = padded["response_mask"].bool()
    outside_pass = response_mask & ~padded["lopti_kl_mask"].bool()
    kl = kl_penalty(logprob=log_prob, ref_logprob=padded["ref_log_prob"], kl_penalty=config.kl_loss_type)
    kl_outside = agg_loss(loss_mat=torch.where(outside_pass, kl, 0.0), loss_mask=response_mask,
                          loss_agg_mode=config.loss_agg_mode, **config.global_batch_info)
    full = metrics["kl_loss"]
    metrics["kl_loss"] = Metric(full.aggregation, full.aggregate() - kl_outside.item())
    return loss - config.kl_loss_coef * kl_outside, metrics


def merge_pass_metrics(pass_metrics):
    """One metrics dict from the passes' dicts: lists are concatenated, numbers averaged (as the AR-Lopti fork)."""
    merged = {}
    for key in pass_metrics[0]:
        values = [metrics[key] for metrics in pass_metrics if key in metrics]
        if isinstance(values[0], list):
            merged[key] = [v for value in values for v in value]
        else:
            merged[key] = sum(values) / len(values)
    return merged


class LoptiRayPPOTrainer(RayPPOTrainer):
    """RayPPOTrainer whose actor update runs Lopti's passes when algorithm.lopti_eta > 0 (Yang et al. 2505.12929).

    Each pass is one ordinary verl actor update (all PPO mini-batches and epochs, its own optimizer steps) on the same
    batch: the same old and reference log-probs, advantages zeroed outside the pass's tokens, the full response_mask
    (so the loss denominator is every valid token), and the pass's tokens as `lopti_kl_mask` for lopti_ppo_loss.
    Each pass also steps verl's lr scheduler once: harmless with the papers' constant learning rate.
    """

    def init_workers(self):
        super().init_workers()
        if self.config.algorithm.get("lopti_eta", 0.0) > 0 and self.config.actor_rollout_ref.actor.use_kl_loss:
            from verl.trainer.distillation import is_distillation_enabled
            from verl.utils.config import omega_conf_to_dataclass

            if is_distillation_enabled(self.config.get("distillation")):
                raise ValueError("Lopti replaces the actor loss to mask its KL term; distillation is not supported")
            actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
            self.actor_rollout_wg.set_loss_fn(partial(lopti_ppo_loss, config=actor_config))

    def _update_actor(self, batch: DataProto) -> DataProto:
        eta = float(self.config.algorithm.get("lopti_eta", 0.0))
        order = self.config.algorithm.get("lopti_order", "low-first")
        response_mask = batch.batch["response_mask"]
        passes = lopti_passes(batch.batch["advantages"], batch.batch["old_log_probs"].exp(), response_mask, eta, order)
        if len(passes) == 1:  # eta <= 0: Lopti off, one ordinary update
            return super()._update_actor(batch)
        pass_metrics = []
        for _name, pass_advantages, pass_mask in passes:
            pass_batch = DataProto(batch=batch.batch.clone(recurse=False), non_tensor_batch=dict(batch.non_tensor_batch),
                                   meta_info=dict(batch.meta_info))  # shallow copy: old/ref log-probs are shared
            pass_batch.batch["advantages"] = pass_advantages.to(batch.batch["advantages"].dtype)
            pass_batch.batch["lopti_kl_mask"] = pass_mask.to(response_mask.dtype)
            pass_metrics.append(super()._update_actor(pass_batch).meta_info["metrics"])
        metrics = merge_pass_metrics(pass_metrics)
        low_mask = passes[0][2] if passes[0][0] == "low" else passes[1][2]
        metrics["actor/lopti_low_token_fraction"] = (low_mask.sum() / response_mask.sum().clamp_min(1)).item()
        return DataProto.from_single_dict(data={}, meta_info={"metrics": metrics})


# Entry point: verl's PPO main (hydra config `ppo_trainer`) with the Lopti trainer
@ray.remote(num_cpus=1)
class LoptiTaskRunner:
    """verl's legacy TaskRunner, building LoptiRayPPOTrainer where it builds RayPPOTrainer."""

    def run(self, config):
        from verl.trainer import main_ppo_v0

        main_ppo_v0.RayPPOTrainer = LoptiRayPPOTrainer  # TaskRunner.run looks the trainer class up by this name
        return main_ppo_v0.TaskRunner.__ray_actor_class__().run(config)


def prepare_config(config):
    """The wiring main() adds to a verl config (also used by the tests): the v0 trainer (the one with _update_actor),
    the AR config class, this module and the repository in every Ray worker's environment."""
    from omegaconf import OmegaConf, open_dict

    from harness.config import Config  # train.py's checks and messages, before verl starts anything

    eta = config.algorithm.get("lopti_eta", 0.0)
    tau, alpha = config.algorithm.get("softmaxgrpo_tau"), config.actor_rollout_ref.actor.policy_loss.get("ar_alpha")
    try:
        Config(tau=0.1 if tau is None else tau, alpha=0.0 if alpha is None else alpha, lopti_eta=eta).validate()
    except ValueError as error:
        raise ValueError(f"{error} (here: algorithm.softmaxgrpo_tau={tau}, actor_rollout_ref.actor.policy_loss."
                         f"ar_alpha={alpha}, algorithm.lopti_eta={eta})") from None
    if eta >= 1:  # every token would be low-probability: the high pass empty, yet run as an actor update
        raise ValueError(f"algorithm.lopti_eta must be < 1 (a probability; 0 = off), got {eta}")
    if eta > 0 and config.algorithm.get("lopti_order", "low-first") not in ("low-first", "high-first"):
        raise ValueError("algorithm.lopti_order must be low-first or high-first")
    with open_dict(config):
        config.trainer.use_v1 = False  # Lopti subclasses RayPPOTrainer, verl's v0 trainer
        if config.actor_rollout_ref.actor.policy_loss.loss_mode == "ar":
            config.actor_rollout_ref.actor.policy_loss._target_ = f"{__name__}.ARPolicyLossConfig"
    key = "ray_kwargs.ray_init.runtime_env.env_vars"
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    # this module registers softmaxgrpo / maxrl / ar in every worker: added after the modules the user already set
    # (in the config or in the environment), which keep their order
    modules = OmegaConf.select(config, f"{key}.VERL_USE_EXTERNAL_MODULES") or \
        os.environ.get("VERL_USE_EXTERNAL_MODULES", "")
    modules = [name.strip() for name in str(modules).split(",") if name.strip()]
    env_vars = {"VERL_USE_EXTERNAL_MODULES": ",".join(modules + [__name__] * (__name__ not in modules)),
                "PYTHONPATH": os.pathsep.join(paths if REPO_ROOT in paths else [REPO_ROOT, *paths])}
    for name, value in env_vars.items():
        OmegaConf.update(config, f"{key}.{name}", value, force_add=True)
    return config


def main():
    """`python -m integrations.verl_plugin <hydra overrides>`: verl's main_ppo, with Lopti and the plug-in wired in."""
    import hydra
    from verl.trainer import main_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    @hydra.main(config_path=os.path.join(os.path.dirname(main_ppo.__file__), "config"), config_name="ppo_trainer",
                version_base=None)
    def run(config):
        auto_set_device(config)
        prepare_config(config)
        validate_config(config=config, use_reference_policy=need_reference_policy(config),
                        use_critic=need_critic(config))
        main_ppo.run_ppo(config, task_runner_class=LoptiTaskRunner)

    run()


for _name in LISTED_AFTER_THIS_MODULE:  # now that this module is complete (see import_verl_in_order)
    importlib.import_module(_name)
