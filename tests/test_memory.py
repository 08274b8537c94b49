"""What makes a run fit a smaller card: activation checkpointing, LoRA adapters with a free reference, the memory
plan. Each option must leave the numbers alone (checkpointing: the same log-probs and gradients; LoRA's reference:
the base model's log-probs) and do what it says (LoRA: only the adapters train; the plan: its hand count)."""
import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

import train
from harness import model as model_module
from harness.config import Config
from harness.model import add_lora, enable_checkpointing, load_policy, merge_adapters, without_adapters
from rollout import token_logprobs
from tests.stubs import SMALL_TRAIN as SMALL, smollm2_or_skip, tiny_policy_and_rollouts


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
    # Without: the shared-prompt forward; with: HF's checkpointed layers, which drop the KV cache, so the plain
    # forward over every row's prompt. Same numbers up to float32 rounding (sums in another order).
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
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
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


def test_lora_without_peft_is_one_line(tmp_path, digits_task, capsys, monkeypatch):
    real = model_module.importlib.util.find_spec
    monkeypatch.setattr(model_module.importlib.util, "find_spec",
                        lambda name, *args: None if name == "peft" else real(name, *args))
    with pytest.raises(SystemExit) as exit_info:
        lora_run(tmp_path / "run", "--steps", "1")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "train.py: error: --lora-rank needs peft: pip install peft"


def test_a_lora_target_the_model_lacks_is_one_line(tmp_path, digits_task, capsys):
    with pytest.raises(SystemExit) as exit_info:
        lora_run(tmp_path / "run", "--steps", "1", "--lora-targets", "q_proj,c_attn")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("llama has no module named c_attn")


@pytest.mark.parametrize("field, value, message", [("lora_rank", -1, "--lora-rank must be >= 0"),
                                                   ("lora_targets", "q_proj,", "--lora-targets must be comma-"),
                                                   ("memory_budget", "lots", "--memory-budget must look like")])
def test_bad_memory_settings_are_one_line(field, value, message):
    with pytest.raises(ValueError, match=message):
        Config(**{field: value}).validate()
