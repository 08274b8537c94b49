"""--fast-generate's entry (rollout.sample_completions' one `if`): the decode loop where it applies,
its self-check on a CUDA device, and the plain call wherever it does not hold.

The self-check: the loop's tokens equal generate's on this project's CPUs (tests/); on a GPU the
kept CUDA graphs, the bf16 cache and the card's kernels were never run by a test. So the first
CUDA call, and the first after an optimizer step moved the weights (the graphs then replay on
new weights), also run with eager steps, from the same random state, at the real rows,
dtype and kernels; on any difference, or an exception of the loop, one line says so and the run
generates with the plain call from then on.
"""
import torch

from fast import decode_loop as loop

SELF_CHECKED_CALLS = 2  # CUDA calls checked graph against eager: the first, and one after a step


def loop_generate(model, input_ids, attention_mask, *, max_new_tokens, pad_id, eos_id,
                  generate_kwargs, log=print):
    """Completion ids [rows, T'] from the decode loop, or None where rollout.py's plain generate
    call should run: the loop does not apply (said once), or its self-check or a capture failed on
    this device (said once). input_ids, attention_mask [rows, P]."""
    verdict = model.__dict__.setdefault("_fast_generate", {"calls": 0, "off": None, "weights": None})
    refusal = loop.decode_loop_refusal(model, generate_kwargs)
    if verdict["off"] is None and refusal:
        verdict["off"] = f"--fast-generate: {refusal}: generating with the plain call"
        log(verdict["off"])
    if verdict["off"]:
        return None
    call = dict(max_new_tokens=max_new_tokens, pad_id=pad_id, eos_id=eos_id,
                generate_kwargs=generate_kwargs)
    checked = untested_device(input_ids.device) and verdict["calls"] < SELF_CHECKED_CALLS
    if checked:  # a weight sample, moved by an optimizer step: no check twice at the same weights
        weights = next(model.parameters()).detach().flatten()[:256].clone()
        checked = verdict["weights"] is None or not torch.equal(weights, verdict["weights"])
    before = loop.rng_state(input_ids.device)
    try:
        completion_ids = loop.static_decode(model, input_ids, attention_mask, **call)
        if checked:
            verdict["calls"], verdict["weights"] = verdict["calls"] + 1, weights
            after = loop.rng_state(input_ids.device)
            loop.set_rng_state(input_ids.device, before)
            eager = loop.static_decode(model, input_ids, attention_mask, capture=False, **call)
            loop.set_rng_state(input_ids.device, after)
            if not torch.equal(eager, completion_ids):
                different = (eager != completion_ids).any(1).sum() if eager.shape == \
                    completion_ids.shape else "all"
                raise RuntimeError(f"the CUDA graphs' tokens differ from eager steps' in "
                                   f"{different} of {len(input_ids)} rows")
            log(f"--fast-generate self-check ({len(input_ids)} rows, call {verdict['calls']}): "
                "the CUDA graphs give the eager steps' tokens")
        return completion_ids
    except Exception as error:  # noqa: BLE001 -- on an untested device the failure is its verdict
        if not untested_device(input_ids.device):
            raise  # on a CPU the loop is tested: its exception is a bug to see
        first_line = (str(error).strip().splitlines() or [""])[0][:200]
        verdict["off"] = (f"--fast-generate ({len(input_ids)} rows) FAILED on this device "
                          f"({type(error).__name__}: {first_line}): generating with the plain "
                          "call for this run")
        log(verdict["off"])
        model.__dict__.pop("_fast_generate_caches", None)  # the static caches and graphs freed
        loop.set_rng_state(input_ids.device, before)  # the plain call draws as without the loop
        return None


def untested_device(device):
    """True on a CUDA device: the loop's tokens are tested against generate's on CPUs only."""
    return device.type == "cuda"
