"""A checkpoint's tensors are what its run's settings say, or the resume is refused at load: one line naming the file
and a checkpoint to resume from instead (never the refused one). Each test spoils one tensor of a saved run."""
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import train
from tests.stubs import SMALL_TRAIN as SMALL

RUNS = {"fp32": [], "bf16": ["--param-dtype", "bf16"], "lora": ["--lora-rank", "2"]}  # bf16: fp32 master weights


@pytest.fixture(scope="module")
def saved_runs(tmp_path_factory):
    """kind -> a run of that kind with checkpoint-2 and checkpoint-4, each made once."""
    made = {}

    def saved(kind):
        if kind not in made:
            made[kind] = tmp_path_factory.mktemp(kind) / "run"
            train.main(["--task", "countdown", "--output-dir", str(made[kind]), *SMALL, "--steps", "4",
                        "--save-every", "2", "--keep-checkpoints", "0", *RUNS[kind]])
        return made[kind]
    return saved


@pytest.fixture
def run_of(saved_runs, tmp_path):
    """kind -> a copy of that saved run, to spoil."""
    return lambda kind: shutil.copytree(saved_runs(kind), tmp_path / kind, symlinks=True)


def spoil_master(checkpoint, change):
    """The first fp32 master weight in checkpoint/trainer_state.pt replaced by change(it)."""
    path = checkpoint / "trainer_state.pt"
    state = torch.load(path, weights_only=True)
    state["optimizer"]["masters"][0] = change(state["optimizer"]["masters"][0])
    torch.save(state, path)


def spoil_weight(checkpoint, change, name="model.safetensors"):
    """The first tensor of checkpoint/name replaced by change(it) -> its key."""
    weights = load_file(checkpoint / name)
    key = sorted(weights)[0]
    weights[key] = change(weights[key])
    save_file(weights, checkpoint / name, metadata={"format": "pt"})
    return key


def refused(capsys, argv):
    """train.main(argv) exits 1 with one line and no traceback -> that line."""
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert exit_info.value.code == 1 and "Traceback" not in err and len(errors) == 1, err
    return errors[0]


def test_an_unspoiled_checkpoint_of_each_kind_resumes(run_of):
    """The checks refuse nothing a run saved itself."""
    for kind in RUNS:
        assert train.main(["--resume", str(run_of(kind)), "--steps", "5"])["after"] is not None


@pytest.mark.parametrize("change,problem", [
    (lambda m: (m * 10).to(torch.int64), "is int64, not float32"),     # was cast: training on whole numbers
    (lambda m: m.tolist(), "is a list, not a tensor"),                 # was an AttributeError
    (lambda m: m[:1], "has shape (1, 32), not (53, 32)"),
    (lambda m: torch.full_like(m, float("nan")), "is not finite"),      # was a RuntimeError in generation
], ids=["int64", "list", "shape", "nan"])
def test_a_master_weight_that_is_not_a_finite_fp32_tensor_of_its_parameter_is_refused(run_of, capsys, change,
                                                                                      problem):
    """A --param-dtype bf16 run's master weight must be a finite float32 tensor of its parameter's shape."""
    out = run_of("bf16")
    spoil_master(out / "checkpoint-4", change)
    error = refused(capsys, ["--resume", str(out), "--steps", "5"])
    assert f"{out / 'checkpoint-4' / 'trainer_state.pt'}: master weight 'model.embed_tokens.weight' {problem}" in error
    assert error.endswith("; resume from checkpoint-2")


@pytest.mark.parametrize("kind,name,dtype", [("fp32", "model.safetensors", "float32"),
                                             ("bf16", "model.safetensors", "bfloat16"),
                                             ("lora", "adapter_model.safetensors", "float32")])
@pytest.mark.parametrize("change,problem", [(lambda w: (w * 10).to(torch.int64), "is int64, not {dtype}"),
                                            (lambda w: torch.full_like(w, float("nan")), "is not finite")],
                         ids=["int64", "nan"])
def test_a_weight_that_is_not_finite_or_not_of_the_runs_dtype_is_refused(run_of, capsys, kind, name, dtype, change,
                                                                        problem):
    """The policy's saved weights must be finite and of --param-dtype's dtype: loading would cast an int64 one."""
    out = run_of(kind)
    key = spoil_weight(out / "checkpoint-4", change, name)
    error = refused(capsys, ["--resume", str(out), "--steps", "5"])
    assert f"{out / 'checkpoint-4' / name}: weight {key!r} {problem.format(dtype=dtype)}" in error
    assert error.endswith("; resume from checkpoint-2") and "continues from checkpoint-4" not in error


def test_the_checkpoint_named_instead_is_another_complete_one_or_none(run_of, capsys):
    """The hint names the newest other complete checkpoint, never the refused one; without one, it says so."""
    out = run_of("bf16")
    spoil_master(out / "checkpoint-2", lambda m: m.to(torch.int64))
    assert refused(capsys, ["--resume", str(out / "checkpoint-2")]).endswith("; resume from checkpoint-4")
    os.remove(out / "checkpoint-4" / "run.json")  # incomplete: not one to resume from
    assert refused(capsys, ["--resume", str(out / "checkpoint-2")]).endswith(
        "; no other complete checkpoint: start the run again")
