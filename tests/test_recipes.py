"""recipes/*.sh resolve to the official settings listed in DESIGN.md section 8, and each runs one tiny step.

A recipe is `python train.py <its flags> "$@"`. The tests read the flags out of the script's `args=( ... )` block the
way bash does (comments dropped, ${VAR:-default} expanded), check `--dry-run`'s resolved settings against every
official value in DESIGN.md, and run one step with the tiny model appended (the last flag wins). One recipe is also
run through bash itself, to show that the script and this reading agree.
"""
import glob
import json
import os
import re
import shlex
import subprocess

import pytest

import train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, "recipes", "*.sh"))
                 if not os.path.basename(p).startswith("verl_"))  # verl launches: integrations, not train.py
TINY = ["--model", "tiny", "--tiny-hidden", "32", "--tiny-layers", "1", "--warm-start-steps", "0", "--steps", "1",
        "--prompts-per-step", "2", "-M", "2", "--max-new-tokens", "4", "--eval-size", "2", "--micro-batch", "4",
        "--rollout-batch", "4"]


def recipe_argv(name):
    text = open(os.path.join(REPO, "recipes", f"{name}.sh")).read()
    block = re.search(r"^args=\($(.*?)^\)$", text, re.S | re.M).group(1)
    block = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: os.environ.get(m.group(1), m.group(2)), block)
    return [token for line in block.splitlines() for token in shlex.split(line, comments=True)]


def official_settings():
    section = open(os.path.join(REPO, "DESIGN.md")).read().split("## 8.")[1]
    table = {}
    for recipe, key, value in re.findall(r"^\| (\w+) \| (\w+) \| ([^|]+?) \|$", section, re.M)[1:]:  # after the header
        try:
            value = json.loads(value)
        except ValueError:
            pass  # a plain string: a model id, a task, an aggregation name
        table.setdefault(recipe, {})[key] = value
    return table


def test_every_recipe_has_official_values_and_every_table_row_a_recipe():
    assert set(official_settings()) == set(RECIPES) and len(RECIPES) == 8


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_resolves_to_the_official_settings(name, capsys):
    settings = train.main(recipe_argv(name) + ["--dry-run"])
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(json.dumps(settings))
    for key, value in official_settings()[name].items():
        assert settings[key] == value, f"{name}: {key} = {settings[key]!r}, official {value!r}"


def test_the_script_itself_agrees_with_this_reading(capsys):
    proc = subprocess.run(["bash", os.path.join("recipes", "lopti_kk_ar_lopti.sh"), "--dry-run"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    train.main(recipe_argv("lopti_kk_ar_lopti") + ["--dry-run"])
    assert json.loads(proc.stdout) == json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", RECIPES)
def test_a_tiny_version_of_the_recipe_runs_one_step(name, tmp_path, digits_task):
    extra = ["--output-dir", str(tmp_path / "run")]
    argv = recipe_argv(name)
    task = argv[argv.index("--task") + 1]
    if task == "gsm8k":
        data = tmp_path / "gsm8k.jsonl"
        data.write_text("\n".join(json.dumps({"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n"
                                              f"#### {2 * i}"}) for i in range(60)) + "\n")
        extra += ["--data", str(data)]
    if task == "deepmath":  # softmaxgrpo_deepmath, softmaxgrpo_qwen3_base (Polaris rows renamed to these fields)
        pytest.importorskip("math_verify", reason="the deepmath task needs math-verify (requirements-dev.txt)")
        data = tmp_path / "deepmath.jsonl"
        data.write_text("\n".join(json.dumps({"question": f"Compute {i} squared.", "final_answer": str(i * i)})
                                  for i in range(60)) + "\n")
        extra += ["--data", str(data)]
    if task == "text_match":  # OpenThoughts-style rows: the reward compares the reference's text after </think>
        data = tmp_path / "openthoughts.jsonl"
        data.write_text("\n".join(json.dumps({"prompt": f"say {i}", "reference": f"<think> so {i} </think> {i} ok"})
                                  for i in range(60)) + "\n")
        extra += ["--data", str(data)]
    if "kk" in name:
        extra += ["--task-option", "people=3"]  # the tiny model's 128 positions hold a 3-person compact puzzle
    result = train.main(argv + TINY + extra)
    rows = [json.loads(line) for line in open(result["metrics_path"])]
    assert [r["step"] for r in rows if not r.get("eval")] == [1]


def test_a_recipes_dry_run_names_its_rules_and_what_it_targets(capsys):
    # it showed "rules": null beside task_options.rules, and the tiny model's settings for a Qwen run
    settings = train.main(recipe_argv("lopti_kk_ar") + ["--dry-run"])
    assert settings["rules"] == settings["task_options"]["rules"] == "logic_rl"
    assert not [key for key in settings if key.startswith(("tiny_", "warm_start_"))]
    assert 'docs/performance.md, "One GPU"' in capsys.readouterr().err


def test_each_recipe_states_what_its_memory_plan_says():
    # the comment line is benchmarks/memory_check.py's recipe_memory_line (--recipe-lines rewrites them all)
    from benchmarks.memory_check import recipe_memory_line
    for name in RECIPES:
        path = os.path.join(REPO, "recipes", f"{name}.sh")
        assert recipe_memory_line(path) in open(path).read().splitlines(), name
