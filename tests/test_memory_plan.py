"""The memory plan (harness/memory.py) and what it tells a user: its hand count, its activations against the tensors
autograd saves, the search for the least costly change that fits a budget and the cost it names for each choice,
the budget's unit, the headroom of "fits", a run over its budget refused before its weights load, and bad settings
or model configs named in one line. What the memory options do to training: tests/test_memory.py."""
import dataclasses
import json
import math
import re

import pytest
import torch
from transformers import AutoModelForCausalLM

import train
from harness import memory
from harness import model as model_module
from harness.config import Config
from harness.model import add_lora, enable_checkpointing
from rollout import token_logprobs
from tests.stubs import SMALL_TRAIN as SMALL

SMALL_SHAPE = memory.ModelShape(hidden=8, intermediate=16, layers=2, heads=2, kv_heads=1, head_dim=4, vocab=10,
                                tied=True)


def test_the_plans_eval_batch_is_rollout_evaluates_default():
    # memory.py is torch-free, so it cannot read rollout.evaluate's default: this keeps the two equal
    import inspect

    import rollout
    assert memory.EVAL_BATCH == inspect.signature(rollout.evaluate).parameters["batch_size"].default


def test_parameter_counts_are_the_models_own():
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    # by hand: embedding 10 x 8; per layer q, o 8 x 8, k, v 8 x 4, gate, up, down 8 x 16, two norms of 8; final norm
    assert SMALL_SHAPE.parameters() == 80 + 2 * (2 * 64 + 2 * 32 + 3 * 128 + 16) + 8 == 1272
    for config_class, model_class in [(LlamaConfig, LlamaForCausalLM), (Qwen2Config, Qwen2ForCausalLM)]:
        for tied in (True, False):
            config = config_class(vocab_size=50, hidden_size=16, intermediate_size=40, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
            model = model_class(config)
            assert memory.shape_from_config(config).parameters() == sum(p.numel() for p in model.parameters())
            lora = add_lora(model, 3, None, "q_proj,k_proj,down_proj")
            adapters = sum(p.numel() for p in lora.parameters() if p.requires_grad)
            assert memory.shape_from_config(config).lora_parameters(3, "q_proj,k_proj,down_proj") == adapters


def test_the_plan_by_hand():
    config = Config(prompts_per_step=1, num_generations=2, eval_size=1, max_new_tokens=2, micro_batch=2, dtype="fp32",
                    device="cpu")
    plan = memory.memory_plan(SMALL_SHAPE, config, prompt_length=3)
    N = 1272
    assert (plan["weights"], plan["gradients"], plan["optimizer"], plan["reference"]) == (4 * N, 4 * N, 8 * N, 0)
    # KV cache: 2 (k, v) x 2 layers x 1 kv head x 4 dims x 2 rows x (3 + 2) positions x 4 bytes
    assert plan["kv_cache"] == 2 * 2 * 4 * 2 * 5 * 4 == 640
    # per token and layer: 16 H fp32 + 4 bytes x (3 x 8 (q) + 2 x 4 (k, v) + 4 x 16 (MLP)) = 128 + 384 = 512 bytes;
    # shared prompt: 1 prompt x 3 + 2 rows x 2 = 7 tokens per layer, and each row's k, v over the prompt
    # (4 bytes x 2 x 4 x 2 rows x 3); the final norm's input and output: 8 H bytes x the same 7 tokens; GQA (2 query
    # heads on 1 KV head): K and V repeated to both heads, (8 - 4) x 2 x 4 bytes per row's 5 positions, per layer
    gqa = 2 * (4 * 2 * (8 - 4) * 2 * 5)
    assert gqa == 640 and plan["activations"] == 2 * (512 * 7 + 4 * 2 * 4 * 2 * 3) + 8 * 8 * 7 + gqa == 8640
    # one layer's backward: 2 [tokens, I] and 2 [tokens, H] gradients, 4 bytes each, over the forward's 7 tokens
    assert plan["backward"] == (2 * 4 * 16 + 2 * 4 * 8) * 7 == 1344
    assert plan["logit_chunk"] == 3 * 4 * 10 * 4
    checkpointed = memory.memory_plan(SMALL_SHAPE, dataclasses.replace(config, gradient_checkpointing=True), 3)
    # every row's 5 tokens: each layer's input (4 H bytes) kept, one layer's 512 bytes per token (and GQA's copies)
    # recomputed; its backward over the same 10 tokens
    assert checkpointed["activations"] == 4 * 8 * 10 * 2 + 512 * 10 + 8 * 8 * 10 + 4 * 2 * (8 - 4) * 2 * 5
    assert checkpointed["backward"] == (2 * 4 * 16 + 2 * 4 * 8) * 10
    lora = memory.memory_plan(SMALL_SHAPE, dataclasses.replace(config, lora_rank=2, kl_coef=0.1), 3)
    adapters = 2 * 2 * ((8 + 8) + (8 + 4) + (8 + 4) + (8 + 8) + 2 * (8 + 16) + (16 + 8))  # 2 layers, rank 2
    assert (lora["weights"], lora["gradients"], lora["reference"]) == (4 * (N + adapters), 4 * adapters, 0)
    full_kl = memory.memory_plan(SMALL_SHAPE, dataclasses.replace(config, kl_coef=0.1), 3)
    assert full_kl["reference"] == 4 * N  # a second fp32 copy
    assert plan["head_gradients"] == 2 * 4 * 10 * 8 and lora["head_gradients"] == 0  # the [V, H] ones, fp32
    # one micro-batch per mini-batch: zero_grad (set_to_none) leaves no gradients in its forward; the rollout (fp32
    # weights, stepped in place) still holds them
    assert plan["rollout_peak"] == 16 * N + 640 + plan["sampling_logits"]
    assert plan["update_peak"] == 12 * N + 8640 + 1344 + plan["logit_chunk"] + 640
    two = memory.memory_plan(SMALL_SHAPE, dataclasses.replace(config, micro_batch=1), 3)  # 2 micro-batches: held
    assert two["update_peak"] == 16 * N + two["activations"] + two["backward"] + two["logit_chunk"] + 640
    bf16 = memory.memory_plan(SMALL_SHAPE, dataclasses.replace(config, param_dtype="bf16", dtype="bf16"), 3)
    assert bf16["rollout_peak"] == 2 * N + 4 * N + 8 * N + bf16["kv_cache"] + bf16["sampling_logits"]  # no gradients
    assert plan["peak"] == max(plan["rollout_peak"], plan["update_peak"])


def test_the_planned_activations_are_the_tensors_autograd_saves(one_thread):
    # Count the bytes of every tensor autograd keeps for backward (each storage once, weights left out) in a
    # training forward of the tiny model, with and without shared prompts; the plan's formula within 15%.
    from harness.tiny import build_char_tokenizer, build_tiny_model
    model = build_tiny_model(build_char_tokenizer(), hidden_size=64, num_layers=2).train()
    shape = memory.shape_from_config(model.config)
    P, T, M, rows = 24, 16, 4, 8
    torch.manual_seed(0)
    ids = torch.cat([torch.randint(4, 20, (rows // M, P)).repeat_interleave(M, 0), torch.randint(4, 20, (rows, T))], 1)
    for checkpointing in (False, True):
        if checkpointing:
            enable_checkpointing(model)
        counted = saved_bytes(model, ids, T)
        config = Config(prompts_per_step=rows // M, num_generations=M, max_new_tokens=T, micro_batch=rows,
                        logit_chunk=4, dtype="fp32", device="cpu", gradient_checkpointing=checkpointing)
        planned = memory.memory_plan(shape, config, P)["activations"]
        if checkpointing:  # one layer's tensors, recomputed in backward, are not saved in the forward
            H, I = shape.hidden, shape.intermediate  # 4 heads of H / 4, no GQA: q = kv = H
            planned -= (16 * H + 4 * (3 * H + 2 * H + 4 * I)) * rows * (P + T)
        assert abs(planned / counted - 1) < 0.15, (checkpointing, planned, counted)


def test_a_budget_gets_the_least_change_that_fits_or_a_clear_no():
    config = Config(model="Qwen/Qwen2.5-1.5B", prompts_per_step=64, num_generations=8, max_new_tokens=256,
                    micro_batch=4, kl_coef=1e-3, dtype="bf16", device="cuda")
    shape = memory.QWEN25["qwen2.5-1.5b"]
    plan = memory.memory_plan(shape, config, 1024)
    assert plan["peak"] > 24e9
    changes, fitted = memory.fitting_settings(shape, config, 1024, 80e9)
    assert changes == {} and fitted["peak"] == plan["peak"]  # an 80 GB card: as it is
    changes, fitted = memory.fitting_settings(shape, config, 1024, 24e9)
    assert changes and fitted["peak"] <= 24e9
    assert memory.memory_plan(shape, dataclasses.replace(config, **changes), 1024)["peak"] == fitted["peak"]
    changes, smallest = memory.fitting_settings(memory.QWEN25["qwen2.5-7b"], config, 1024, 8e9)
    assert changes is None and smallest["peak"] > 8e9
    text = memory.plan_text(smallest, 8e9, (changes, smallest))
    assert "does not fit" in text


@pytest.mark.parametrize("text, size", [("24GB", 24e9), ("24GiB", 24 * 2**30), ("80G", 80 * 2**30),
                                        ("512mb", 512e6), ("1.5TB", 1.5e12), ("lots", None), ("0GB", None),
                                        ("24", None)])
def test_sizes_read_as_a_card_is_labelled(text, size):
    assert memory.parse_size(text) == size


def test_the_dry_run_plans_without_loading_weights(tmp_path, capsys, monkeypatch):
    def no_weights(*args, **kwargs):
        raise AssertionError("the dry run loaded weights")
    monkeypatch.setattr(model_module, "load_policy", no_weights)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", no_weights)
    settings = train.main(["--dry-run", "--output-dir", str(tmp_path), "--memory-budget", "1MB",
                           "--gradient-checkpointing"])
    err = capsys.readouterr().err
    assert settings["gradient_checkpointing"] and "memory plan for cpu" in err and "does not fit" in err
    train.main(["--dry-run", "--output-dir", str(tmp_path), "--model", "Qwen/Qwen2.5-0.5B-Instruct",
                "--max-prompt-length", "256", "--memory-budget", "24GB"])
    err = capsys.readouterr().err
    assert "494.0M parameters" in err and "budget 24.0 GB, fits when" in err and "<= budget: fits with --" in err


# --- what a new user is told: the device and dtypes planned for, headroom, the budget's unit, a run refused -------
def plan_lines(capsys, *flags):
    train.main(["--dry-run", *flags])
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_the_plan_names_the_device_and_dtypes_and_plans_a_gpu_on_any_machine(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU-only machine
    flags = ["--output-dir", str(tmp_path), "--model", "Qwen/Qwen2.5-1.5B", "--max-prompt-length", "1024"]
    [cpu] = [line for line in plan_lines(capsys, *flags) if line.startswith("memory plan")]
    assert cpu.startswith("memory plan for cpu, fp32 weights, fp32 compute")
    [cuda] = [line for line in plan_lines(capsys, *flags, "--device", "cuda") if line.startswith("memory plan")]
    assert cuda.startswith("memory plan for cuda, fp32 weights, bf16 compute")  # --dtype auto: bf16 on CUDA
    with pytest.raises(SystemExit):  # training on it still needs the device
        train.main(["--output-dir", str(tmp_path / "run"), "--device", "cuda", "--steps", "0"])
    assert "this torch sees no CUDA device" in capsys.readouterr().err


def test_fits_keeps_headroom_for_the_plans_error_and_a_cuda_context():
    config = Config(model="Qwen/Qwen2.5-0.5B", prompts_per_step=64, num_generations=8, max_new_tokens=256,
                    micro_batch=4, dtype="bf16", device="cuda")
    shape = memory.QWEN25["qwen2.5-0.5b"]
    plan = memory.memory_plan(shape, config, 1024)
    just_above = plan["peak"] * 1.01  # the peak itself fits, with no room for error or context
    changes, fitted = memory.fitting_settings(shape, config, 1024, just_above)
    assert changes != {} and memory.needed(fitted) <= just_above
    assert memory.needed(plan) == plan["peak"] * (1 + memory.PLAN_ERROR) + memory.CUDA_CONTEXT
    roomy = memory.needed(plan)
    assert memory.fitting_settings(shape, config, 1024, roomy)[0] == {}
    cpu = memory.memory_plan(shape, dataclasses.replace(config, device="cpu"), 1024)
    assert memory.needed(cpu) == cpu["peak"] * (1 + memory.PLAN_ERROR)  # no CUDA context on a CPU


def test_a_budget_without_its_unit_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--dry-run", "--memory-budget", "24"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == "train.py: error: --memory-budget must be a size with its unit, " \
        "like 24GB, 80GiB or 512MB, got '24'"


def test_a_budget_checks_a_run_before_its_weights_load(tmp_path, digits_task, capsys, monkeypatch):
    from harness import tiny
    real = tiny.build_tiny_model
    built = []
    monkeypatch.setattr(tiny, "build_tiny_model", lambda *args, **kwargs: built.append(1) or real(*args, **kwargs))
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--task", "digits", "--output-dir", str(tmp_path / "small"), *SMALL, "--steps", "1",
                    "--memory-budget", "10KB"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and not built and len(err.splitlines()) == 1
    assert err.startswith("train.py: error: --memory-budget 10KB: this run's memory plan needs ")
    train.main(["--task", "digits", "--output-dir", str(tmp_path / "roomy"), *SMALL, "--steps", "1",
                "--memory-budget", "1GB"])
    assert built and "of the --memory-budget 1GB" in capsys.readouterr().out


def test_where_the_weights_alone_exceed_the_budget_the_plan_says_so():
    config = Config(model="Qwen/Qwen2.5-7B", prompts_per_step=64, num_generations=8, max_new_tokens=256,
                    micro_batch=4, dtype="bf16", device="cuda")
    shape = memory.QWEN25["qwen2.5-7b"]
    fit = memory.fitting_settings(shape, config, 1024, 4e9)  # under even LoRA on a 4-bit base's 5.6 GB
    text = memory.plan_text(memory.memory_plan(shape, config, 1024), 4e9, fit)
    assert fit[0] is None and f"the weights alone need {fit[1]['weights'] / 1e9:.3f} GB" in text
    assert "cannot help" in text and "fewer prompts per step" not in text
    fit = memory.fitting_settings(shape, config, 1024, 40e9, allowed=())  # over the weights, under what is held
    text = memory.plan_text(memory.memory_plan(shape, config, 1024), 40e9, fit)
    assert fit[0] is None and "what every step holds" in text, text


def test_the_plan_of_8bit_moments():
    config = Config(prompts_per_step=1, num_generations=2, eval_size=1, max_new_tokens=2, micro_batch=2, dtype="fp32", device="cpu",
                    optimizer="adamw8bit")
    # two moments of 1 byte per weight, plus one float32 scale per block of 256 weights each
    assert memory.memory_plan(SMALL_SHAPE, config, 3)["optimizer"] == int(2 * (1 + 4 / 256) * 1272)


@pytest.mark.parametrize("storage", ["fp32", "bf16"])
def test_memory_check_runs_on_a_cpu(capsys, storage):
    from benchmarks import memory_check
    memory_check.main(["--model", "test", "--prompts", "2", "-M", "2", "--max-new-tokens", "4", "--micro-batch", "2",
                       "--kl-coef", "0.1", "--param-dtype", storage])
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert result["plan"]["reference"] > 0 and result["measured"]["peak"] > 0 and result["completion_tokens"] == 4
    assert (result["plan"]["master_weights"] > 0) == (storage == "bf16")  # the masters planned, and
    assert abs(result["weights_measured"] / result["plan"]["weights"] - 1) < 0.01  # the weights stored, as planned


def saved_bytes(model, ids, T):
    """Bytes of the distinct storages autograd saves (weights excluded) in a training forward of `ids` whose last T
    positions are the completion: what the plan's activations count."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        token_logprobs(model, ids, torch.ones_like(ids), torch.ones(ids.shape[0], T), logit_chunk=4)
    return sum(saved.values())


def test_the_planned_gqa_copies_are_the_k_and_v_sdpa_saves(one_thread):
    # A tiny Llama with 8 query heads on 1 KV head: transformers' repeat_kv copies K and V to every head and SDPA
    # saves the copies (a small MLP, so that they weigh). The planned activations within 5% of the tensors autograd
    # saves (measured: +3%), and without the GQA term off by more than 10% (measured: -12%).
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=40, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=1, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).train()
    shape = memory.shape_from_config(model.config)
    P, T, rows = 24, 16, 8
    ids = torch.randint(4, 40, (rows, P + T))
    counted = saved_bytes(model, ids, T)
    run = Config(prompts_per_step=rows, num_generations=1, max_new_tokens=T, micro_batch=rows, logit_chunk=4,
                 dtype="fp32", device="cpu")  # M = 1: no shared prompts
    plan = memory.memory_plan(shape, run, P)
    gqa = 4 * 2 * (shape.heads - shape.kv_heads) * shape.head_dim * rows * (P + T) * shape.layers
    assert abs(plan["activations"] / counted - 1) < 0.05, (plan["activations"], counted)
    assert abs((plan["activations"] - gqa) / counted - 1) > 0.10, (plan["activations"] - gqa, counted)


def test_the_plan_of_bf16_storage():
    config = Config(prompts_per_step=1, num_generations=2, eval_size=1, max_new_tokens=2, micro_batch=2, dtype="bf16",
                    device="cpu", kl_coef=0.1)
    fp32 = memory.memory_plan(SMALL_SHAPE, config, 3)
    bf16 = memory.memory_plan(SMALL_SHAPE, dataclasses.replace(config, param_dtype="bf16"), 3)
    N = SMALL_SHAPE.parameters()
    assert (bf16["weights"], bf16["gradients"], bf16["master_weights"], bf16["reference"]) == (2 * N, 2 * N, 4 * N,
                                                                                             2 * N)
    assert bf16["optimizer"] == fp32["optimizer"] == 8 * N and fp32["master_weights"] == 0
    assert bf16["head_gradients"] == fp32["head_gradients"] // 2
    lora = memory.memory_plan(SMALL_SHAPE, dataclasses.replace(config, param_dtype="bf16", lora_rank=2), 3)
    adapters = lora["assumed"]["trained_parameters"]
    assert lora["weights"] == 2 * (N + adapters) and lora["reference"] == 0  # the frozen base in bf16


def test_the_search_tries_the_fields_options_in_order_of_cost_and_prices_each_choice():
    config = Config(model="Qwen/Qwen2.5-7B", prompts_per_step=64, num_generations=8, max_new_tokens=256,
                    micro_batch=4, kl_coef=1e-3, dtype="bf16", device="cuda", lora_rank=16)
    levels = memory.option_levels(config, memory.STEPS)
    assert levels[0] == [] and levels[1] == ["gradient_checkpointing"] and ["param_dtype"] in levels[2:4]
    assert all("lora_rank" not in combo for combo in levels)  # already on
    shape = memory.QWEN25["qwen2.5-7b"]
    fit = memory.fitting_settings(shape, config, 1024, 24e9)
    changes, fitted = fit
    assert changes["param_dtype"] == "bf16" and memory.needed(fitted) <= 24e9  # LoRA's frozen base in bf16
    without_bf16 = memory.fitting_settings(shape, config, 1024, 24e9, allowed=("gradient_checkpointing",
                                                                               "optimizer"))
    assert without_bf16[0] is None  # the fp32 base alone is 30 GB
    text = memory.fit_text(memory.memory_plan(shape, config, 1024), 24e9, fit)
    lines = text.splitlines()
    for key in changes:
        if key in memory.OPTIONS:
            assert sum(line.strip().startswith(f"--{key.replace('_', '-')}") for line in lines) == 1, key
    assert memory.NOT_AVAILABLE in text


def test_the_plan_of_a_nf4_base_and_of_offloaded_states():
    config = Config(prompts_per_step=1, num_generations=2, eval_size=1, max_new_tokens=2, micro_batch=2, dtype="bf16",
                    device="cuda", param_dtype="bf16", lora_rank=2)
    N, H, I = SMALL_SHAPE.parameters(), 8, 16
    projections = 2 * (2 * 64 + 2 * 32 + 3 * 128)  # what NF4 quantizes: the 7 projections of 2 layers
    bf16 = memory.memory_plan(SMALL_SHAPE, config, 3)
    nf4 = memory.memory_plan(SMALL_SHAPE, dataclasses.replace(config, base_dtype="nf4"), 3)
    adapters = nf4["assumed"]["trained_parameters"]
    assert bf16["weights"] == 2 * (N + adapters)
    assert nf4["weights"] == 2 * (N - projections + adapters) + math.ceil((0.5 + 1 / 64 + 4 / 16384) * projections)
    assert nf4["nf4_dequantized"] == 2 * H * I and bf16["nf4_dequantized"] == 0  # one MLP matrix at a time
    assert nf4["rollout_peak"] - bf16["rollout_peak"] == nf4["weights"] - bf16["weights"] + 2 * H * I
    full = dataclasses.replace(config, lora_rank=0, kl_coef=0.1)
    on_card = memory.memory_plan(SMALL_SHAPE, full, 3)
    offloaded = memory.memory_plan(SMALL_SHAPE, dataclasses.replace(full, optimizer_offload=True), 3)
    assert (offloaded["master_weights"], offloaded["optimizer"]) == (0, 0)  # off the card
    assert offloaded["offloaded"] == on_card["master_weights"] + on_card["optimizer"] == 12 * N
    assert offloaded["weights"] == on_card["weights"] and offloaded["reference"] == on_card["reference"]
    assert on_card["peak"] - offloaded["peak"] >= 12 * N - on_card["optimizer_step"]
    fp32 = dataclasses.replace(full, param_dtype="fp32", optimizer_offload=True)  # fp32 weights: masters offloaded
    assert memory.memory_plan(SMALL_SHAPE, fp32, 3)["offloaded"] == 12 * N  # too (a CPU copy of each)
    on_cpu = memory.memory_plan(SMALL_SHAPE, dataclasses.replace(full, optimizer_offload=True, device="cpu"), 3)
    assert on_cpu["offloaded"] == 0 and on_cpu["optimizer"] == 8 * N  # a CPU has one memory: nothing moves
    assert "in CPU memory, not in the peak" in memory.plan_text(offloaded)


def test_the_search_reaches_offload_and_nf4_last_and_prices_them():
    assert memory.STEPS.index("optimizer") < memory.STEPS.index("optimizer_offload") < \
        memory.STEPS.index("lora_rank") < memory.STEPS.index("base_dtype")
    config = Config(model="Qwen/Qwen2.5-7B", prompts_per_step=64, num_generations=8, max_new_tokens=256,
                    micro_batch=4, kl_coef=1e-3, dtype="bf16", device="cuda")
    full = memory.option_levels(config, [s for s in memory.STEPS if s != "lora_rank"])
    assert all("base_dtype" not in combo for combo in full)  # NF4 is LoRA's base: never without LoRA
    shape = memory.QWEN25["qwen2.5-7b"]
    changes, fitted = memory.fitting_settings(shape, config, 1024, 80e9,
                                              allowed=[s for s in memory.STEPS if s != "lora_rank"])
    assert changes["optimizer_offload"] is True and memory.needed(fitted) <= 80e9  # 7B full on 80 GB: offloaded
    text = memory.fit_text(memory.memory_plan(shape, config, 1024), 80e9, (changes, fitted))
    assert sum(line.strip().startswith("--optimizer-offload: time:") for line in text.splitlines()) == 1
    lora = dataclasses.replace(config, lora_rank=16)
    changes, fitted = memory.fitting_settings(shape, lora, 1024, 16e9)  # 7B LoRA on 16 GB: only a 4-bit base
    assert changes["base_dtype"] == "nf4" and memory.needed(fitted) <= 16e9
    assert "--base-dtype nf4: precision:" in memory.fit_text(memory.memory_plan(shape, lora, 1024), 16e9,
                                                              (changes, fitted))


# --- issue 37 item 7, the memory plan's part: wrong types and ranges named in one line, batches it did not count ----
PLAN_CONFIG = Config(prompts_per_step=2, num_generations=4, max_new_tokens=4, micro_batch=4, dtype="fp32",
                     device="cpu", eval_size=4)


@pytest.mark.parametrize("field, value, flag", [
    ("micro_batch", 0, "--micro-batch"), ("micro_batch", -4, "--micro-batch"), ("micro_batch", "8", "--micro-batch"),
    ("micro_batch", [8], "--micro-batch"), ("micro_batch", None, "--micro-batch"), ("micro_batch", 1.5, "--micro-batch"),
    ("micro_batch", True, "--micro-batch"), ("micro_batch", 2**40, "--micro-batch"),
    ("prompts_per_step", -2, "--prompts-per-step"), ("num_generations", {"a": 1}, "--num-generations"),
    ("max_new_tokens", float("nan"), "--max-new-tokens"), ("logit_chunk", 0, "--logit-chunk"),
    ("lora_rank", -16, "--lora-rank"), ("rollout_batch", 0, "--rollout-batch"), ("eval_size", "200", "--eval-size"),
    ("kl_coef", float("nan"), "--kl-coef"), ("kl_coef", float("inf"), "--kl-coef"), ("kl_coef", -0.1, "--kl-coef"),
    ("kl_coef", "0.1", "--kl-coef"), ("dtype", "fp16", "--dtype"), ("param_dtype", None, "--param-dtype"),
    ("optimizer", ["adamw"], "--optimizer"), ("base_dtype", "nf8", "--base-dtype"),
    ("gradient_checkpointing", "yes", "--gradient-checkpointing"), ("optimizer_offload", 1, "--optimizer-offload"),
    ("device", 0, "--device")])
def test_the_plan_names_a_setting_of_the_wrong_type_or_range(field, value, flag):
    config = dataclasses.replace(PLAN_CONFIG, **{field: value})  # not validated: as Python, or a run.json, may build it
    with pytest.raises(ValueError) as error:
        memory.memory_plan(SMALL_SHAPE, config, 3)
    assert str(error.value).startswith(f"memory plan: {flag}") and "\n" not in str(error.value)
    with pytest.raises(ValueError):
        memory.fitting_settings(SMALL_SHAPE, config, 3, 24e9)


@pytest.mark.parametrize("prompt_length", [0, -3, 2.5, "16", None, 2**40])
def test_the_plan_names_a_prompt_length_of_the_wrong_type_or_range(prompt_length):
    with pytest.raises(ValueError, match="^memory plan: the prompt length is"):
        memory.memory_plan(SMALL_SHAPE, PLAN_CONFIG, prompt_length)


@pytest.mark.parametrize("key, value", [("hidden_size", -8), ("hidden_size", 0), ("hidden_size", float("nan")),
                                        ("hidden_size", "8"), ("intermediate_size", None), ("vocab_size", [10]),
                                        ("num_hidden_layers", 10**30), ("num_attention_heads", True),
                                        ("tie_word_embeddings", "false"), ("head_dim", -1)])
def test_a_model_config_of_the_wrong_type_or_range_is_named_and_never_fits(key, value):
    fields = {"model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2,
              "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 10, "tie_word_embeddings": True}
    assert memory.shape_from_config(memory._Fields(fields)) == SMALL_SHAPE
    with pytest.raises(ValueError, match=f"^the model's {key} is "):
        memory.shape_from_config(memory._Fields({**fields, key: value}))
    with pytest.raises(ValueError, match="^the model's hidden_size is -8"):  # however a shape is built
        dataclasses.replace(SMALL_SHAPE, hidden=-8)


@pytest.mark.parametrize("fields, message", [([1, 2], "config.json is list, not a JSON object"),
                                             ({"text_config": "x"}, "config.json's text_config is 'x'"),
                                             ({"text_config": [1]}, "config.json's text_config is [1]")])
def test_a_nested_config_of_the_wrong_kind_is_named(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        memory._Fields(fields)


def test_a_dry_run_on_a_model_config_with_a_null_size_is_one_note(tmp_path, capsys):
    fields = {"model_type": "llama", "hidden_size": 64, "intermediate_size": None, "num_hidden_layers": 2,
              "num_attention_heads": 4, "vocab_size": 128}
    (tmp_path / "config.json").write_text(json.dumps(fields))
    train.main(["--dry-run", "--model", str(tmp_path), "--device", "cuda", "--memory-budget", "24GB"])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "fits" not in err
    assert [line for line in err.splitlines() if "memory plan" in line] == [
        f"note: no memory plan: the config of {tmp_path} could not be read (the model's intermediate_size is None; "
        "the memory plan needs an integer from 1 to 262144)"]


def test_the_plan_counts_the_held_out_evals_generate_batch_and_the_eval_honours_rollout_batch(tmp_path, digits_task,
                                                                                              monkeypatch):
    config = dataclasses.replace(PLAN_CONFIG, eval_size=200)  # 8 rows a step, 200 held-out prompts
    plan = memory.memory_plan(SMALL_SHAPE, config, 3)
    assert plan["assumed"]["eval_rows"] == 200 and plan["kv_cache"] == 2 * 2 * 4 * 200 * (3 + 4) * 4
    capped = memory.memory_plan(SMALL_SHAPE, dataclasses.replace(config, rollout_batch=4), 3)
    assert capped["assumed"]["eval_rows"] == 4 and capped["kv_cache"] == 2 * 2 * 4 * 4 * (3 + 4) * 4
    sizes, real = [], train.evaluate
    monkeypatch.setattr(train, "evaluate", lambda *args, **kwargs: sizes.append(kwargs["batch_size"]) or
                        real(*args, **kwargs))
    train.main(["--task", "digits", "--output-dir", str(tmp_path / "run"), *SMALL, "--steps", "1",
                "--rollout-batch", "4"])
    assert sizes and set(sizes) == {4}  # the eval's generate calls as small as the rollouts'


def test_a_logged_memory_row_names_its_commit_date_machine_and_command():
    from benchmarks.memory_check import log_row
    result = {"setting": "base", "plan": {"peak": 1}, "measured": {"peak": 2}}
    row = log_row(result, ["python", "benchmarks/memory_check.py", "--model", "tiny"])
    assert row["setting"] == "base" and row["plan"] == {"peak": 1}  # the result kept as it was
    assert row["commit"] and row["date"].endswith("UTC") and row["machine"] and row["load"] is not None
    assert row["command"] == "benchmarks/memory_check.py --model tiny"


@pytest.mark.parametrize("base", [dict(), dict(logprob_fp32=True), dict(kl_coef=0.0), dict(lora_rank=16),
                                  dict(param_dtype="bf16-sr"), dict(step_in_backward=True, grad_clip=0.0,
                                                                    micro_batch=512)])
def test_every_setting_the_search_proposes_is_one_config_accepts(base):
    # the search's answers across budgets from roomy to hopeless: each, applied to the run's settings, validates
    # (a combination config.py refuses, e.g. --logprob-fp32 on bf16 weights, is never proposed)
    config = Config(**{**dict(model="Qwen/Qwen2.5-0.5B", prompts_per_step=64, num_generations=8, max_new_tokens=256,
                              micro_batch=4, dtype="bf16", device="cuda", kl_coef=0.001), **base})
    config.validate()
    proposed = 0
    for budget_gb in (80, 40, 24, 16, 12, 8, 6, 4):
        for allowed in (memory.STEPS, memory.STEPS + memory.OBJECTIVE_STEPS):
            changes, _ = memory.fitting_settings(memory.QWEN25["qwen2.5-0.5b"], config, 1024, budget_gb * 1e9,
                                                 allowed=allowed)
            if changes:
                dataclasses.replace(config, **changes).validate()
                proposed += 1
    assert proposed >= 4  # the grid reaches budgets where a change is needed and found


# --- a plan that answers the question asked (issue 64) ----------------------------------------------------------------
COUNTDOWN_3B = ["--model", "Qwen/Qwen2.5-3B", "--device", "cuda", "--memory-budget", "24GB", "--max-prompt-length",
                "1024", "--max-new-tokens", "256"]  # the Countdown recipe's shape on a 24 GB card


def test_the_plan_says_per_mode_whether_full_parameter_fits(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    lines = plan_lines(capsys, "--output-dir", str(tmp_path), *COUNTDOWN_3B, "--kl-coef", "1e-3")
    after = lines[lines.index("  per mode, on 24.0 GB (each searched alone):") + 1:]
    modes = {line.strip().split(":")[0]: line for line in after if line.startswith("    ")}
    assert "does not fit" in modes["full-parameter, all on the card"]
    assert "does not fit" in modes["full-parameter, AdamW's states offloaded"]
    assert "--step-in-backward" in modes["full-parameter, all on the card, --kl-coef 0 (another objective)"]
    assert "256 optimizer steps a batch" in modes["full-parameter, all on the card, --kl-coef 0 (another objective)"]
    assert "fits with --gradient-checkpointing --lora-rank 16" in modes["LoRA rank 16"]
    assert any(memory.NOT_AVAILABLE in line for line in lines)  # the KL term was given: --kl-coef 0 is not tried
    # without the KL term: both full-parameter modes fit, and nothing says --kl-coef 0 was not tried
    lines = plan_lines(capsys, "--output-dir", str(tmp_path), *COUNTDOWN_3B, "--kl-coef", "0")
    assert not any("not tried" in line for line in lines)
    [proposed] = [line for line in lines if "<= budget:" in line]
    assert "--optimizer-offload --param-dtype bf16" in proposed  # the README's 3B sentence says this
    assert any("full-parameter, all on the card: fits with" in line and "256 optimizer steps a batch" in line
               for line in lines)


def test_memory_fit_full_proposes_full_parameter_only(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    flags = ["--output-dir", str(tmp_path), *COUNTDOWN_3B, "--kl-coef", "1e-3"]
    [any_mode] = [line for line in plan_lines(capsys, *flags) if "<= budget:" in line]
    assert "--lora-rank 16" in any_mode
    lines = plan_lines(capsys, *flags, "--memory-fit", "full")
    [full] = [line for line in lines if "<= budget:" in line]
    assert "does not fit" in full and "--lora-rank" not in full
    assert not any(line.strip().startswith("LoRA") for line in lines)
    with pytest.raises(SystemExit):
        train.main(["--dry-run", "--memory-fit", "lora"])
    assert "--memory-fit" in capsys.readouterr().err


def test_a_run_whose_plan_exceeds_this_machine_says_so_before_it_starts(tmp_path, capsys, monkeypatch):
    from harness import settle
    assert settle.machine_memory("cpu")[0] > 1e8 and settle.machine_memory("mps") is None
    monkeypatch.setattr(settle, "machine_memory", lambda device: (4e9, "this machine's total RAM"))
    config = Config(model="Qwen/Qwen2.5-0.5B-Instruct", max_prompt_length=256, device="cpu", dtype="fp32")
    settle.within_machine(config)
    out = capsys.readouterr().out
    assert out.startswith("note: this run's memory plan needs ") and "more than this machine's total RAM, 4GB" in out
    assert "it fits with --" in out and "--dry-run --memory-budget 4GB" in out and out.count("\n") == 1
    monkeypatch.setattr(settle, "machine_memory", lambda device: (1e13, "this machine's total RAM"))
    settle.within_machine(config)
    assert capsys.readouterr().out == ""  # a plan that fits: nothing said


def test_plan_states_each_cards_step_time_as_estimated_and_settings_no_gpu_ran(capsys):
    """--dry-run on CUDA: the step's time per card, per phase the larger of its device time (the floor,
    benchmarks/floor.py's count held equal here on a uniform workload, at memory.EFFICIENCY of the peaks) and its
    host time (the H200 log's per call, token, micro-batch and step), labelled estimated with its sources; each
    proposed setting no GPU has run a step with is marked so (issue 67: a 24 GB plan gave no time and never said
    which settings were untried)."""
    from benchmarks import floor
    from harness import settle
    config = Config(model="Qwen/Qwen2.5-0.5B", device="cuda", dtype="bf16", prompts_per_step=16, num_generations=8,
                    max_new_tokens=256, micro_batch=16)
    shape = memory.QWEN25["qwen2.5-0.5b"]
    # generate prefills every row's prompt (as 128 distinct prompts); the update's forwards share a group's prompt
    peaks, qwen = floor.Peaks(989e12, 4.8e12, "H200"), floor.shape_of("qwen2.5-0.5b")
    work = floor.uniform_workload(16, 8, 33, 256, "bf16", micro_batch=16)
    rows = floor.uniform_workload(128, 1, 33, 256, "bf16", micro_batch=16)
    by_floor = sum(f.seconds for name, f in floor.step_floors(qwen, work, peaks).items() if name != "prefill") \
        + floor.prefill_floor(qwen, rows, peaks).seconds
    phases = memory.step_phases(shape, config, 33, memory.GPU_PEAKS["H200"])
    assert sum(device for device, _ in phases.values()) * memory.EFFICIENCY == pytest.approx(by_floor, rel=1e-9)
    line = memory.step_time_text(shape, config, 33)
    assert "estimated per phase" in line and "gpu-h200-27cee0c" in line and "H200 ~7.33 s" in line and "L4 ~" in line
    assert memory.never_on_gpu({"fast_generate": True, "micro_batch": 2}) == " [never run on a GPU: --fast-generate]"
    assert "--optimizer-offload" in memory.never_on_gpu({"optimizer_offload": True})
    settle.print_memory_plan(dataclasses.replace(config, model="Qwen/Qwen2.5-3B", memory_budget="24GB",
                                                  fast_generate=True))
    err = capsys.readouterr().err
    assert "step time at this run's settings (estimated" in err and "[never run on a GPU: --fast-generate]" in err
    assert err.count("[never run on a GPU") >= 4  # each fit's untried options, each mode's


@pytest.mark.parametrize("cache, logged", [("roomy", 8.23), ("HF's", 7.34)])
def test_the_step_estimate_reproduces_the_logged_h200_steps(cache, logged):
    """The estimate against the only logged GPU steps (lab/logs/gpu-h200-27cee0c: r1-roomy.txt 8.23 s, r2-concat.txt
    7.34 s, Qwen2.5-0.5B's shape, 16 prompts x 8 x 256, micro-batch 16, prompt 33 tokens): within +-20 %, each phase
    host-bound there (decode 76-88x its floor). Before issue 73 the plan scaled every card's floor by that step's
    ratio (41.7), so a host-bound decode slowed 3.3x with a 4090's bandwidth."""
    config = Config(model="Qwen/Qwen2.5-0.5B", device="cuda", dtype="bf16", prompts_per_step=16, num_generations=8,
                    max_new_tokens=256, micro_batch=16)
    shape, h200 = memory.QWEN25["qwen2.5-0.5b"], memory.GPU_PEAKS["H200"]
    step = lambda peaks: sum(map(max, memory.step_phases(shape, config, 33, peaks).values()))  # noqa: E731
    assert step(h200) == pytest.approx(logged, rel=0.2)
    assert all(host > device for device, host in memory.step_phases(shape, config, 33, h200).values())
    assert step(memory.GPU_PEAKS["RTX 4090"]) < 1.1 * step(h200)  # host-bound: the card's bandwidth barely counts


def test_the_step_estimate_counts_each_options_work():
    """Per phase: more micro-batches cost host time, more generate calls decode time; --gradient-checkpointing
    adds a forward (4/3 of the update), LoRA drops the weight gradients (2/3), --optimizer-offload steps AdamW on the
    CPU (28 bytes a weight at CPU_ADAMW) and moves the weights over the link."""
    base = Config(model="Qwen/Qwen2.5-3B", device="cuda", dtype="bf16", prompts_per_step=16, num_generations=8,
                  max_new_tokens=256, micro_batch=16)
    shape, rtx = memory.QWEN25["qwen2.5-3b"], memory.GPU_PEAKS["RTX 4090"]
    phases = lambda **changes: memory.step_phases(shape, dataclasses.replace(base, **changes), 33, rtx)  # noqa: E731
    assert phases(micro_batch=2)["update"][1] == pytest.approx(8 * phases()["update"][1])
    assert phases(rollout_batch=64)["decode"][1] == pytest.approx(2 * phases()["decode"][1])
    assert phases(gradient_checkpointing=True)["update"][0] == pytest.approx(4 / 3 * phases()["update"][0])
    assert phases(lora_rank=16)["update"][0] == pytest.approx(2 / 3 * phases()["update"][0])
    offload = phases(optimizer_offload=True, param_dtype="bf16")["optimizer"]
    assert offload[1] == pytest.approx(shape.parameters() * (28 / memory.CPU_ADAMW + 6 / memory.PCIE))
