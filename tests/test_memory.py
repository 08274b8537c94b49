"""What makes a run fit a smaller card, as training sees it: activation checkpointing, LoRA adapters with a free
reference, 8-bit moments, bf16 storage on fp32 masters, offloaded states, a 4-bit base. Each option must leave the
numbers alone (checkpointing: the same log-probs and gradients; LoRA's reference: the base model's log-probs) and do
what it says (LoRA: only the adapters train). The memory plan that chooses among them: tests/test_memory_plan.py."""
import copy
import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

import train
from harness import model as model_module
from harness.checkpoint import checkpoint_steps
from harness.config import Config
from harness.model import add_lora, enable_checkpointing, load_policy, merge_adapters, without_adapters
from rollout import token_logprobs
from tests.stubs import (SMALL_TRAIN as SMALL, assert_resume_from_checkpoint_2_continues, smollm2_or_skip,
                         tiny_policy_and_rollouts)


def logprobs_and_gradients(model, rollouts, **options):
    """[B, T] log-probs of the rollouts' tokens and d(sum of them)/d(each trained parameter), in training mode."""
    model.train()
    logprobs = token_logprobs(model, rollouts.input_ids, rollouts.attention_mask, rollouts.completion_mask,
                              **options)
    params = [p for p in model.parameters() if p.requires_grad]
    return logprobs.detach(), torch.autograd.grad((logprobs * rollouts.completion_mask).sum(), params)


def assert_same(a, b, atol, rtol):
    (lp_a, grads_a), (lp_b, grads_b) = a, b
    torch.testing.assert_close(lp_a, lp_b, atol=atol, rtol=rtol)
    for x, y in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(x, y, atol=atol, rtol=rtol)


# --- activation checkpointing ------------------------------------------------------------------------------------
def test_checkpointing_gives_the_same_logprobs_and_gradients(one_thread):
    # Without and with HF's checkpointed layers (recomputed in backward): the same numbers up to float32 rounding
    # (sums in another order).
    _, model, rollouts = tiny_policy_and_rollouts()
    without = logprobs_and_gradients(model, rollouts, micro_batch=3)
    enable_checkpointing(model)
    recomputed = []  # each checkpointed layer's forward runs again in backward (attention: the MLP's end is cut
    hook = model.model.layers[0].self_attn.register_forward_hook(lambda *args: recomputed.append(1))  # short)
    with_checkpointing = logprobs_and_gradients(model, rollouts, micro_batch=3)
    hook.remove()
    assert len(recomputed) == 2 * 3  # 3 micro-batches of the 8 rows, each layer run twice
    assert_same(with_checkpointing, without, atol=1e-5, rtol=1e-4)


def test_a_checkpointed_run_updates_like_one_without(tmp_path, digits_task):
    runs = {}
    for name, flags in [("plain", []), ("checkpointed", ["--gradient-checkpointing"])]:
        out = tmp_path / name
        train.main(["--task", "digits", "--output-dir", str(out), *SMALL, "--steps", "2", *flags])
        runs[name] = AutoModelForCausalLM.from_pretrained(out / "latest").state_dict()
    for key, value in runs["plain"].items():  # two AdamW steps amplify float rounding a little
        torch.testing.assert_close(runs["checkpointed"][key], value, atol=1e-5, rtol=1e-4, msg=key)


@pytest.mark.slow
def test_smollm2_checkpointing_gives_the_same_logprobs_and_gradients():
    smollm2_or_skip()
    model, tokenizer = load_policy("smollm2")
    prompts = [tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                       add_generation_prompt=True))["input_ids"]
               for text in ("Name a prime number.", "Hi")]
    from rollout import generate_rollouts
    torch.manual_seed(0)
    rollouts = generate_rollouts(model, tokenizer, prompts, 2, max_new_tokens=6)
    for p in model.parameters():  # the last layers only: enough to see the gradient through the checkpointed stack
        p.requires_grad_(False)
    for p in [*model.model.layers[0].parameters(), *model.model.layers[-1].parameters()]:
        p.requires_grad_(True)
    without = logprobs_and_gradients(model, rollouts)
    enable_checkpointing(model)
    assert_same(logprobs_and_gradients(model, rollouts), without, atol=1e-4, rtol=1e-3)


# --- LoRA -----------------------------------------------------------------------------------------------------------
def lora_policy(tmp_path):
    """-> (policy with rank-4 adapters whose B is random (so it differs from its base), rollouts, the base's
    folder): the tiny policy's base weights are saved first, for a separately loaded copy."""
    tokenizer, model, rollouts = tiny_policy_and_rollouts()
    model.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    policy = add_lora(model, 4, None, "q_proj,v_proj,down_proj")
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    return policy, rollouts, tmp_path / "base"


def test_lora_trains_only_the_adapters(tmp_path):
    policy, _, _ = lora_policy(tmp_path)
    trained = {name: p.numel() for name, p in policy.named_parameters() if p.requires_grad}
    hidden, layers = 32, 1  # the stub's tiny Llama; q, v: hidden x hidden; down: intermediate -> hidden
    intermediate = policy.config.intermediate_size
    rank = 4  # A: rank x in, B: out x rank
    expected = layers * rank * ((hidden + hidden) * 2 + intermediate + hidden)
    assert all(".lora_A." in name or ".lora_B." in name for name in trained)
    assert len(trained) == 2 * 3 * layers and sum(trained.values()) == expected


def test_lora_reference_is_the_base_model_without_a_copy(tmp_path):
    policy, rollouts, base_folder = lora_policy(tmp_path)
    reference = without_adapters(policy).eval()
    base = AutoModelForCausalLM.from_pretrained(base_folder).eval()
    batch = (rollouts.input_ids, rollouts.attention_mask, rollouts.completion_mask)
    with torch.no_grad():
        ref_lp, base_lp, policy_lp = (token_logprobs(m, *batch) for m in (reference, base, policy))
    torch.testing.assert_close(ref_lp, base_lp, atol=1e-6, rtol=0)
    assert (policy_lp - base_lp).abs().max() > 1e-2  # the adapters do change the policy
    shared = {p.data_ptr() for p in policy.parameters()}
    assert all(p.data_ptr() in shared for p in reference.parameters())  # the policy's own tensors, no copy
    assert not any("lora" in name for name, _ in reference.named_parameters())


def test_merged_export_loads_with_plain_transformers(tmp_path):
    policy, rollouts, _ = lora_policy(tmp_path)
    batch = (rollouts.input_ids, rollouts.attention_mask, rollouts.completion_mask)
    with torch.no_grad():
        expected = token_logprobs(policy.eval(), *batch)
    merge_adapters(policy).save_pretrained(tmp_path / "merged")
    assert not os.path.exists(tmp_path / "merged" / "adapter_config.json")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        torch.testing.assert_close(token_logprobs(loaded, *batch), expected, atol=1e-5, rtol=0)


def lora_run(out, *extra):
    return train.main(["--task", "digits", "--output-dir", str(out), *SMALL, "--lora-rank", "4", *extra])


def adapter_weights(folder):
    from safetensors.torch import load_file
    return load_file(os.path.join(folder, model_module.ADAPTER_WEIGHTS))


def test_a_lora_run_saves_adapters_and_resumes_exactly(tmp_path, digits_task):
    out = tmp_path / "run"
    lora_run(out, "--steps", "4", "--save-every", "2", "--keep-checkpoints", "0", "--kl-coef", "0.05")
    checkpoint = out / "checkpoint-4"
    assert not os.path.exists(checkpoint / "model.safetensors")  # the adapters alone
    final, rows = adapter_weights(checkpoint), (out / "metrics.jsonl").read_text()
    trainer_state = torch.load(checkpoint / "trainer_state.pt", weights_only=True)
    assert len(trainer_state["optimizer"]["state"]) == len(final)  # AdamW moments for the adapters only
    assert any(v.abs().sum() > 0 for k, v in final.items() if "lora_B" in k)  # B moved off 0: it trained
    train.main(["--resume", str(out / "checkpoint-2"), "--keep-checkpoints", "0"])
    strip = lambda text: [{k: v for k, v in json.loads(line).items() if not k.endswith("_s")}  # noqa: E731
                          for line in text.splitlines()]
    assert strip((out / "metrics.jsonl").read_text()) == strip(rows)
    resumed = adapter_weights(out / "latest")
    assert all(torch.equal(resumed[k], v) for k, v in final.items())


def test_export_of_a_lora_run_is_a_plain_model(tmp_path, digits_task):
    from harness.merge_lora import main as export
    out = tmp_path / "run"
    lora_run(out, "--steps", "1")
    export([str(out / "latest"), str(tmp_path / "merged")])
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not any("lora" in name for name in loaded.state_dict())


@pytest.mark.parametrize("inside", ["files", "config.json"])
def test_export_never_writes_into_an_existing_folder(tmp_path, digits_task, capsys, inside):
    # It deleted everything in a non-empty folder without config.json, and said "merged" into one with it
    from harness.merge_lora import main as export
    out, target = tmp_path / "run", tmp_path / "mine"
    lora_run(out, "--steps", "1")
    capsys.readouterr()
    (target / "notes").mkdir(parents=True)
    (target / "notes" / "thesis.txt").write_text("years of work")
    (target / ("config.json" if inside == "config.json" else "data.csv")).write_text("{}")
    before = sorted((p.relative_to(target), p.read_bytes() if p.is_file() else None) for p in target.rglob("*"))
    with pytest.raises(SystemExit) as exit_info:
        export([str(out / "latest"), str(target)])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 1 and err == f"merge_lora: error: {target} already exists; name a folder " \
        "that does not exist yet"
    assert sorted((p.relative_to(target), p.read_bytes() if p.is_file() else None) for p in target.rglob("*")) \
        == before


@pytest.mark.parametrize("key, value", [("lora_alpha", 64), ("use_rslora", True), ("lora_dropout", 0.5),
                                        ("alpha_pattern", {"q_proj": 99}), ("init_lora_weights", "pissa"),
                                        ("r", 8), ("modules_to_save", ["lm_head"]), ("target_modules", ["q_proj"])])
def test_an_adapter_config_that_disagrees_with_run_json_is_one_line(tmp_path, digits_task, capsys, key, value):
    # peft would take the file's word (alpha, rsLoRA, a PiSSA init that rewrites the base weights) and resume rc 0
    from harness.merge_lora import main as export
    out = tmp_path / "run"
    lora_run(out, "--steps", "2", "--save-every", "1", "--keep-checkpoints", "0")
    path = out / "checkpoint-1" / "adapter_config.json"
    saved = json.loads(path.read_text())
    saved[key] = value
    path.write_text(json.dumps(saved))
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--resume", str(out / "checkpoint-1"), "--steps", "3"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 1 and f"adapter_config.json: {key} is {value!r}" in err, err
    assert "run.json" in err and checkpoint_steps(str(out)) == [1, 2]
    with pytest.raises(SystemExit):
        export([str(out / "checkpoint-1"), str(tmp_path / "merged")])
    assert f"{key} is {value!r}" in capsys.readouterr().err and not os.path.exists(tmp_path / "merged")


def test_adapter_weights_of_another_rank_are_refused_from_the_header(tmp_path, digits_task, capsys):
    from safetensors.torch import save_file
    out = tmp_path / "run"
    lora_run(out, "--steps", "1")
    weights = adapter_weights(out / "latest")
    name = next(key for key in weights if "lora_A" in key)
    weights[name] = torch.zeros(512, weights[name].shape[1])  # a rank far above run.json's
    save_file(weights, str(out / "latest" / model_module.ADAPTER_WEIGHTS))
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--resume", str(out), "--steps", "2"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 1 and "(512, " in err and "this run's adapters have (4, " in err, err


def test_lora_without_peft_is_one_line(tmp_path, digits_task, capsys, monkeypatch):
    real = model_module.importlib.util.find_spec
    monkeypatch.setattr(model_module.importlib.util, "find_spec",
                        lambda name, *args: None if name == "peft" else real(name, *args))
    with pytest.raises(SystemExit) as exit_info:
        lora_run(tmp_path / "run", "--steps", "1")
    assert exit_info.value.code == 2
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert last_line == "train.py: error: --lora-rank needs peft: pip install peft"


def test_a_lora_target_the_model_lacks_is_one_line(tmp_path, digits_task, capsys):
    with pytest.raises(SystemExit) as exit_info:
        lora_run(tmp_path / "run", "--steps", "1", "--lora-targets", "q_proj,c_attn")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("llama has no module named c_attn")


def test_a_dry_run_checks_the_lora_targets_against_the_model(tmp_path, digits_task, capsys):
    # --dry-run accepted --lora-targets nonexistent, which the run then refused
    with pytest.raises(SystemExit) as exit_info:
        lora_run(tmp_path / "run", "--dry-run", "--lora-targets", "q_proj,nonexistent")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("llama has no module named nonexistent")
    lora_run(tmp_path / "run", "--dry-run", "--lora-targets", "q_proj,down_proj")  # names it has: planned


@pytest.mark.parametrize("field, value, message", [("lora_rank", -1, "--lora-rank must lie in "),
                                                   ("lora_targets", "q_proj,", "--lora-targets must be comma-"),
                                                   ("memory_budget", "lots", "--memory-budget must be a size")])
def test_bad_memory_settings_are_one_line(field, value, message):
    with pytest.raises(ValueError, match=message):
        Config(**{field: value}).validate()


# --- 8-bit AdamW (torchao, optional) ---------------------------------------------------------------------------------
def test_adamw8bit_without_torchao_is_one_line(tmp_path, digits_task, capsys, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "torchao" else real(name, *args))
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--task", "digits", "--output-dir", str(tmp_path / "run"), *SMALL, "--steps", "1",
                    "--optimizer", "adamw8bit"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "train.py: error: --optimizer adamw8bit needs torchao: pip install torchao"


@pytest.mark.slow
def test_adamw8bit_keeps_8bit_moments_tracks_adamw_and_resumes_exactly(tmp_path, digits_task):
    # torch.compile's first step takes minutes on a CPU: slow
    pytest.importorskip("torchao", reason="--optimizer adamw8bit needs torchao")
    runs = {}
    for name in ("adamw", "adamw8bit"):
        out = tmp_path / name
        train.main(["--task", "digits", "--output-dir", str(out), *SMALL, "--steps", "4", "--save-every", "2",
                    "--keep-checkpoints", "0", "--optimizer", name, "--tiny-hidden", "64"])  # MLP: 12 288 weights
        runs[name] = AutoModelForCausalLM.from_pretrained(out / "latest").state_dict()
    state = torch.load(tmp_path / "adamw8bit" / "latest" / "trainer_state.pt", weights_only=True)["optimizer"]
    moments = [value for param_state in state["state"].values() for key, value in param_state.items()
               if key.startswith("exp_avg") and value.numel() >= 4096]  # torchao keeps smaller tensors' in fp32
    assert moments and all(type(m).__name__ == "OptimState8bit" and m.codes.dtype == torch.uint8 for m in moments)
    initial = AutoModelForCausalLM.from_pretrained(tmp_path / "adamw" / "checkpoint-2").state_dict()
    moved = sum((runs["adamw"][k] - initial[k]).abs().sum() for k in initial)
    apart = sum((runs["adamw8bit"][k] - runs["adamw"][k]).abs().sum() for k in initial)
    assert apart < 0.1 * moved  # 8-bit moments: the same steps up to quantization
    rows = (tmp_path / "adamw8bit" / "metrics.jsonl").read_text()
    train.main(["--resume", str(tmp_path / "adamw8bit" / "checkpoint-2"), "--keep-checkpoints", "0"])
    resumed = AutoModelForCausalLM.from_pretrained(tmp_path / "adamw8bit" / "latest").state_dict()
    assert all(torch.equal(resumed[k], v) for k, v in runs["adamw8bit"].items())
    strip = lambda text: [{k: v for k, v in json.loads(line).items() if not k.endswith("_s")}  # noqa: E731
                          for line in text.splitlines()]
    assert strip((tmp_path / "adamw8bit" / "metrics.jsonl").read_text()) == strip(rows)


# --- bf16 storage: --param-dtype bf16, the optimizer on fp32 master weights ------------------------------------------
def test_master_weights_step_as_adamw_on_fp32_and_keep_the_small_steps():
    from harness.master_weights import MasterWeights
    torch.manual_seed(0)
    start = torch.randn(64).to(torch.bfloat16)
    bf16, fp32 = start.clone().requires_grad_(), start.float().requires_grad_()
    ours = MasterWeights([bf16], torch.optim.AdamW, lr=1e-4, weight_decay=0.01)
    theirs = torch.optim.AdamW([fp32], lr=1e-4, weight_decay=0.01)
    for _ in range(20):
        grad = torch.randn(64).to(torch.bfloat16)  # the same gradient, exactly, in both dtypes
        bf16.grad, fp32.grad = grad.clone(), grad.float()
        ours.step(), theirs.step()
        ours.zero_grad(), theirs.zero_grad()
    assert torch.equal(ours.masters[0], fp32.detach())  # the masters are AdamW's fp32 weights, exactly
    assert torch.equal(bf16.detach(), fp32.detach().to(torch.bfloat16))  # the weights follow them, rounded
    moved = (fp32.detach() - start.float()).abs()
    assert moved.max() < 2 ** -8 and moved.min() > 0  # each step below bf16's resolution at 1: kept by the masters
    assert ours.state[bf16]["exp_avg"].dtype == torch.float32  # the moments of the fp32 masters


def test_a_bf16_run_stores_bf16_loads_in_plain_transformers_and_resumes_exactly(tmp_path, digits_task):
    out = tmp_path / "run"
    seen = {}
    real = train.policy.build_policy

    def build_policy(*args, **kwargs):
        model, ref_model = real(*args, **kwargs)
        seen.update(policy={p.dtype for p in model.parameters()}, reference={p.dtype for p in ref_model.parameters()})
        return model, ref_model
    train.policy.build_policy = build_policy
    try:
        train.main(["--task", "digits", "--output-dir", str(out), *SMALL, "--steps", "4", "--save-every", "2",
                    "--keep-checkpoints", "0", "--kl-coef", "0.05", "--param-dtype", "bf16"])
    finally:
        train.policy.build_policy = real
    assert seen == {"policy": {torch.bfloat16}, "reference": {torch.bfloat16}}
    final = AutoModelForCausalLM.from_pretrained(out / "checkpoint-4")  # plain transformers, no flag
    assert {p.dtype for p in final.parameters()} == {torch.bfloat16}
    start = AutoModelForCausalLM.from_pretrained(out / "checkpoint-2").state_dict()
    assert any(not torch.equal(start[k], v) for k, v in final.state_dict().items())  # it trained
    state = torch.load(out / "checkpoint-4" / "trainer_state.pt", weights_only=True)["optimizer"]
    assert state["masters"] and all(m.dtype == torch.float32 for m in state["masters"])
    assert_resume_from_checkpoint_2_continues(out, final)


def test_a_bf16_lora_run_keeps_its_frozen_base_in_bf16_and_resumes_exactly(tmp_path, digits_task):
    out = tmp_path / "run"
    lora_run(out, "--steps", "4", "--save-every", "2", "--keep-checkpoints", "0", "--kl-coef", "0.05",
             "--param-dtype", "bf16")
    final = adapter_weights(out / "checkpoint-4")
    assert {v.dtype for v in final.values()} == {torch.bfloat16}
    train.main(["--resume", str(out / "checkpoint-2"), "--keep-checkpoints", "0"])
    resumed = adapter_weights(out / "latest")
    assert all(torch.equal(resumed[k], v) for k, v in final.items())


@pytest.mark.parametrize("flags, message", [
    (["--dtype", "fp32"], "--param-dtype bf16 computes in bf16: give --dtype bf16 or auto with it, not fp32"),
    (["--logprob-fp32"], "--logprob-fp32 needs fp32 weights: give it or --param-dtype bf16, not both")])
def test_bf16_storage_with_an_fp32_setting_is_one_line(flags, message, capsys):
    with pytest.raises(SystemExit):
        train.main(["--dry-run", "--param-dtype", "bf16", *flags])
    assert capsys.readouterr().err.strip() == f"train.py: error: {message}"


def test_master_weights_step_one_tensor_at_a_time_as_one_adamw_step_over_all():
    from harness.master_weights import MasterWeights
    torch.manual_seed(0)
    starts = [torch.randn(5, 3).to(torch.bfloat16), torch.randn(7).to(torch.bfloat16), torch.randn(4)]  # 1 fp32
    ours = [t.clone().requires_grad_() for t in starts]
    theirs = [t.float().requires_grad_() for t in starts]
    optimizers = (MasterWeights(ours, torch.optim.AdamW, lr=1e-3), torch.optim.AdamW(theirs, lr=1e-3))
    for step in range(4):
        for a, b in zip(ours, theirs):
            grad = torch.randn(a.shape).to(a.dtype)
            a.grad, b.grad = (None, None) if step == 1 and a.dim() == 1 else (grad.clone(), grad.float())
        [optimizer.step() for optimizer in optimizers]
    for a, b in zip(ours, theirs):
        assert torch.equal(a.detach(), b.detach().to(a.dtype))
    assert torch.equal(optimizers[0].masters[0], theirs[0].detach())


# --- optimizer states in CPU memory (--optimizer-offload) and a 4-bit base (--base-dtype nf4) ----------------------
@pytest.mark.parametrize("storage", [torch.float32, torch.bfloat16])
def test_offloaded_states_step_as_adamw_bit_for_bit_and_resume_exactly(storage):
    # the wrapper's logic with state_device="cpu" on CPU tensors (a CUDA run differs only in where the weights live)
    from harness.master_weights import MasterWeights
    torch.manual_seed(0)
    starts = [torch.randn(5, 3), torch.randn(7), torch.randn(4)]
    ours = [t.to(storage).requires_grad_() for t in starts]
    theirs = [t.to(storage).float().requires_grad_() for t in starts]  # plain AdamW on the same fp32 weights
    offloaded = MasterWeights(ours, torch.optim.AdamW, state_device="cpu", lr=1e-3, weight_decay=0.01)
    plain = torch.optim.AdamW(theirs, lr=1e-3, weight_decay=0.01)
    assert all(m is not p and m.dtype == torch.float32 for m, p in zip(offloaded.masters, ours))  # every one
    grads = [[torch.randn(t.shape).to(storage) for t in starts] for _ in range(6)]
    for step, step_grads in enumerate(grads[:3]):
        for a, b, grad in zip(ours, theirs, step_grads):
            a.grad, b.grad = (None, None) if step == 1 and a.dim() == 1 else (grad.clone(), grad.float())
        offloaded.step(), plain.step()
    saved = copy.deepcopy(offloaded.state_dict())  # as torch.save would: the live tensors step on
    again = [p.detach().clone().requires_grad_() for p in ours]
    resumed = MasterWeights(again, torch.optim.AdamW, state_device="cpu", lr=1e-3, weight_decay=0.01)
    resumed.load_state_dict(saved)
    for step_grads in grads[3:]:
        for a, b, c, grad in zip(ours, theirs, again, step_grads):
            a.grad, b.grad, c.grad = grad.clone(), grad.float(), grad.clone()
        offloaded.step(), plain.step(), resumed.step()
    for a, b, c, m in zip(ours, theirs, again, offloaded.masters):
        assert torch.equal(m, b.detach()) and torch.equal(a.detach(), b.detach().to(storage))  # AdamW's, exactly
        assert torch.equal(c.detach(), a.detach())  # the resumed optimizer: the same steps
    assert all(s["exp_avg"].device.type == "cpu" for s in offloaded.state.values())


def test_optimizer_offload_on_a_cpu_is_one_line(tmp_path, digits_task, capsys):
    with pytest.raises(SystemExit):
        train.main(["--task", "digits", "--output-dir", str(tmp_path / "run"), *SMALL, "--steps", "1",
                    "--device", "cpu", "--optimizer-offload"])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "train.py: error: --optimizer-offload moves the optimizer's states from a CUDA card to CPU memory; on "
        "--device cpu they are in that memory already: drop the flag (a dry run plans a CUDA run with --device cuda)")
    assert not os.path.exists(tmp_path / "run" / "metrics.jsonl")


def test_a_nf4_lora_run_trains_on_a_4bit_base_resumes_exactly_and_merges_into_that_base(tmp_path, digits_task):
    pytest.importorskip("torchao", reason="--base-dtype nf4 needs torchao")
    from harness.merge_lora import main as export
    out, seen, real = tmp_path / "run", {}, train.policy.build_policy

    def build_policy(*args, **kwargs):
        model, ref_model = real(*args, **kwargs)
        seen["base"] = {type(m.weight).__name__ for m in model_module.nf4_linears(model)}
        seen["reference"] = {type(m.weight).__name__ for m in model_module.nf4_linears(ref_model)}
        seen["shared"] = all(any(r.weight is m.weight for r in model_module.nf4_linears(ref_model))
                             for m in model_module.nf4_linears(model))
        return model, ref_model
    train.policy.build_policy = build_policy
    try:
        lora_run(out, "--steps", "4", "--save-every", "2", "--keep-checkpoints", "0", "--kl-coef", "0.05",
                 "--param-dtype", "bf16", "--base-dtype", "nf4", "--lr", "1e-2", "--lora-targets", "q_proj,v_proj")
    finally:
        train.policy.build_policy = real
    assert seen == {"base": {"NF4Tensor"}, "reference": {"NF4Tensor"}, "shared": True}  # the reference: no copy
    final = adapter_weights(out / "checkpoint-4")
    assert any(v.abs().sum() > 0 for k, v in final.items() if "lora_B" in k)  # it trained
    rows = (out / "metrics.jsonl").read_text()
    train.main(["--resume", str(out / "checkpoint-2"), "--keep-checkpoints", "0"])
    resumed = adapter_weights(out / "latest")
    assert all(torch.equal(resumed[k], v) for k, v in final.items())
    strip = lambda text: [{k: v for k, v in json.loads(line).items() if not k.endswith("_s")}  # noqa: E731
                          for line in text.splitlines()]
    assert strip((out / "metrics.jsonl").read_text()) == strip(rows)
    # merge_lora dequantizes: the adapters folded into the NF4 base the policy ran with, a plain bf16 model
    export([str(out / "latest"), str(tmp_path / "merged")])
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    initial = AutoModelForCausalLM.from_pretrained(json.loads((out / "latest" / "run.json").read_text())
                                                   ["initial_policy"]).to(torch.bfloat16)
    model_module.nf4_round_trip(initial)
    down = "model.layers.0.mlp.down_proj.weight"  # no adapter there (but NF4: every frozen linear): the NF4 base
    assert merged.state_dict()[down].dtype == torch.bfloat16
    assert torch.equal(merged.state_dict()[down], initial.state_dict()[down])
    assert not torch.equal(initial.state_dict()[down],
                           AutoModelForCausalLM.from_pretrained(json.loads((out / "latest" / "run.json").read_text())
                                                                ["initial_policy"]).state_dict()[down].bfloat16())


@pytest.mark.parametrize("flags, message", [
    ([], "--base-dtype nf4 quantizes LoRA's frozen base: give --lora-rank with it")])
def test_nf4_without_lora_is_one_line(flags, message, capsys):
    with pytest.raises(SystemExit):
        train.main(["--dry-run", "--base-dtype", "nf4", *flags])
    assert capsys.readouterr().err.strip() == f"train.py: error: {message}"


def test_nf4_without_torchao_is_one_line(tmp_path, digits_task, capsys, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "torchao" else real(name, *args))
    with pytest.raises(SystemExit):
        train.main(["--task", "digits", "--output-dir", str(tmp_path / "run"), *SMALL, "--steps", "1",
                    "--lora-rank", "4", "--base-dtype", "nf4"])
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "train.py: error: --base-dtype nf4 needs torchao: pip install torchao"
