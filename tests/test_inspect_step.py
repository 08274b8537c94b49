"""harness/step_page.py (and experiments/inspect_step.py): the page of one step shows the lesson's own numbers (advantages, p_old, AR's weights,
Lopti's passes, the clip), holds no external reference, escapes completions, stays small, and is the same page
whether train.py --inspect-every wrote it or the command re-sampled the step from the checkpoint before it; a run
without the flag writes what it wrote before."""
import filecmp
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
import torch

import tasks
import train
from experiments import inspect_step
from harness import step_page
from harness import run as run_module
from harness.checkpoint import remove_run
from harness.config import Config
from harness.tiny import build_char_tokenizer
from lopti import reweight_advantages
from rollout import token_logprobs
from softmax_grpo import group_advantages, prompt_weight
from tests.stubs import SMALL_TRAIN as SMALL, DigitsTask, tiny_policy_and_rollouts

CHROMIUM = "/usr/bin/chromium"


class Page(HTMLParser):
    """The page's completion rows (their data attributes and cells' text) and each row's token spans (text, title)."""
    def __init__(self, text):
        super().__init__()
        self.rows, self.tags, self.in_span = [], set(), None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.add(tag)
        if tag == "tr" and "data-reward" in attrs:
            self.rows.append({**attrs, "tokens": [], "cells": []})
        elif tag == "span" and "title" in attrs and self.rows and "p_old" in attrs["title"]:
            self.in_span = [attrs["title"], attrs.get("class", ""), ""]
        elif tag == "td" and self.rows:
            self.rows[-1]["cells"].append("")

    def handle_endtag(self, tag):
        if tag == "span" and self.in_span:
            self.rows[-1]["tokens"].append(tuple(self.in_span))
            self.in_span = None

    def handle_data(self, data):
        if self.in_span:
            self.in_span[2] += data
        elif self.rows and self.rows[-1]["cells"]:
            self.rows[-1]["cells"][-1] += data


def title_numbers(title):
    return {key: float(value) for key, value in re.findall(r"(p_old|AR weight|ratio) (-?[\d.]+)", title)}


def record_of_tiny_rollouts(rewards, *, lr=None, **settings):
    """A record of the stub tiny policy's 8 rollouts (2 prompts x 4) with the given rewards, and after an update
    with train.update_policy at `lr` (None: no update, ratio 1). -> (record, model, rollouts, config)."""
    tokenizer, model, rollouts = tiny_policy_and_rollouts()
    config = Config(num_generations=4, prompts_per_step=2, max_new_tokens=6, dtype="fp32", device="cpu",
                    output_dir="unused", **settings)
    rewards = torch.tensor(rewards, dtype=torch.float32).flatten()
    record = step_page.before_update(config, 5, model, tokenizer, DigitsTask(), rollouts, rewards, due=True)
    stats = {}
    if lr is not None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        advantages = group_advantages(rewards.view(2, 4), config.method, tau=config.tau).view(-1)
        stats = train.update_batch(model, optimizer, rollouts.input_ids, rollouts.attention_mask,
                                   rollouts.completion_mask, advantages, config)
    return record, model, rollouts, config, stats


def finished_page(record, model, stats, tmp_path):
    path = step_page.after_update(record, model, stats, path=str(tmp_path / "page.html"))
    return open(path, encoding="utf-8").read()


# --- the numbers are the lesson's ---------------------------------------------------------------------------------
def test_the_page_shows_the_advantages_p_old_ar_weights_and_lopti_passes_of_the_lesson(tmp_path, one_thread):
    rewards = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0]]  # a rare success, a mostly-solved group
    record, model, rollouts, config, stats = record_of_tiny_rollouts(rewards, method="softmax", tau=0.1)
    text = finished_page(record, model, stats, tmp_path)
    page = Page(text)
    assert [row["data-group"] for row in page.rows] == ["0"] * 4 + ["1"] * 4  # both groups, all completions
    R = torch.tensor(rewards)
    for name in ("softmax", "grpo"):  # the run's method and GRPO's, beside each other
        expected = group_advantages(R, name, tau=0.1).flatten().tolist()
        assert [float(row[f"data-adv-{name}"]) for row in page.rows] == expected
    softmax, grpo = group_advantages(R, "softmax", tau=0.1), group_advantages(R, "grpo")
    assert softmax[0, 0] > grpo[0, 0] + 1  # the rare success: SoftmaxGRPO's larger advantage is what is shown
    assert f"{float(softmax[0, 0]):+.3f}" in page.rows[0]["cells"][2] and \
        f"{float(grpo[0, 0]):+.3f}" in page.rows[0]["cells"][3]
    assert f"{prompt_weight(0.25, 4, 0.1):.3f}" in text and "1 of 4</b> succeeded" in text
    # p_old by the plain log-prob path (rollout.token_logprobs' definition), AR at the paper's alpha, Lopti at eta
    with torch.no_grad():
        p_old = token_logprobs(model, rollouts.input_ids, rollouts.attention_mask, rollouts.completion_mask).exp()
    mask = rollouts.completion_mask
    weights = reweight_advantages(torch.ones(8), p_old, mask, step_page.SHOWN_ALPHA)
    tokens = 0
    for b, row in enumerate(page.rows):
        assert len(row["tokens"]) == int(mask[b].sum())
        for t, (title, classes, _) in enumerate(row["tokens"]):
            numbers = title_numbers(title)
            assert numbers["p_old"] == pytest.approx(float(p_old[b, t]), abs=6e-4)
            assert numbers["AR weight"] == pytest.approx(float(weights[b, t]), abs=6e-4)
            assert numbers["AR weight"] == pytest.approx(0.3 * numbers["p_old"] + 0.7, abs=1e-3)
            low = float(p_old[b, t]) < step_page.SHOWN_ETA
            assert ("Lopti low" in title) == low and ("lo" in classes.split()) == low
            assert numbers["ratio"] == 1.0 and "(clipped)" not in title  # no update: pi_after = pi_old
            tokens += 1
    assert 0 < int(record.low.sum()) and tokens == int(mask.sum())


def test_the_boxed_tokens_are_those_the_clip_holds_after_the_update(tmp_path, one_thread):
    rewards = [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0]]
    record, model, _, config, stats = record_of_tiny_rollouts(rewards, lr=0.2, method="grpo", clip_high=0.28)
    text = finished_page(record, model, stats, tmp_path)
    page = Page(text)
    assert {"data-adv-grpo", "data-adv-softmax"} <= set(page.rows[0])  # a GRPO run: SoftmaxGRPO's beside it
    clipped = checked = 0
    for row in page.rows:
        advantage = float(row["data-adv-grpo"])  # alpha = 0: every token carries its completion's advantage
        for title, classes, _ in row["tokens"]:
            ratio = title_numbers(title)["ratio"]
            if min(abs(ratio - 0.8), abs(ratio - 1.28)) < 2e-3:
                continue  # too near a clip edge for a 3-decimal title to decide
            held = (advantage < 0 and ratio < 0.8) or (advantage > 0 and ratio > 1.28)
            assert ("(clipped)" in title) == held == ("cl" in classes.split()), (title, advantage)
            clipped += held
            checked += 1
    assert clipped > 0 and checked > clipped  # a large step: some tokens beyond the clip, most not
    assert "optimizer_steps 1" in text and f"clip_frac_high {stats['clip_frac_high']:.4g}" in text


def test_clip_masks_are_the_clip_fractions_of_policy_loss():
    from ppo import clip_masks, policy_loss
    torch.manual_seed(0)
    logprobs, old = torch.randn(6, 9) * 0.3 - 1, torch.randn(6, 9) * 0.3 - 1
    advantages, mask = torch.randn(6, 1), (torch.rand(6, 9) > 0.2).float()
    low, high = clip_masks((logprobs - old).exp(), advantages, mask, clip_low=0.2, clip_high=0.28)
    _, stats = policy_loss(logprobs, old, advantages[:, 0], mask, clip_low=0.2, clip_high=0.28)
    assert low.any() and high.any() and not (low & high).any() and not ((low | high) & (mask == 0)).any()
    assert stats["clip_frac_low"] == low.sum() / mask.sum() and stats["clip_frac_high"] == high.sum() / mask.sum()
    ratio = (logprobs - old).exp()
    assert torch.equal(high, (mask > 0) & (advantages > 0) & (ratio > 1.28))


# --- safe and small -----------------------------------------------------------------------------------------------
class ScriptTokenizer:
    """The char tokenizer, but every token decodes as an HTML injection."""
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def batch_decode(self, ids, **kwargs):
        return ['<script>"x"</script>&' for _ in ids]  # within TOKEN_CHARS


def test_completion_and_prompt_text_is_escaped(tmp_path, one_thread):
    record, model, _, _, stats = record_of_tiny_rollouts([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0]])
    record.tokenizer = ScriptTokenizer(record.tokenizer)
    record.prompts = ['<img src="http://example.com/x.png"><script>alert(1)</script>'] * 2
    text = finished_page(record, model, stats, tmp_path)
    assert "<script" not in text.lower() and "<img" not in text.lower()
    assert "&lt;script&gt;&quot;x&quot;&lt;/script&gt;&amp;" in text and "&lt;img src=" in text
    assert Page(text).tags <= {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "div", "table",
                               "tr", "th", "td", "span", "b", "br", "sub", "section", "svg", "rect", "line", "text"}


def long_record(T=5000, G=8, M=16):
    """A record of G groups of M completions of T tokens each (the lesson's functions on random tensors)."""
    tokenizer = build_char_tokenizer()
    torch.manual_seed(0)
    config = Config(num_generations=M, prompts_per_step=G, dtype="fp32", output_dir="unused")
    successes = [0, 1, 3, M // 2, M - 1, M, M, M][:G]  # all four kinds of group
    rewards = (torch.arange(M)[None, :] < torch.tensor(successes)[:, None]).float()
    mask = torch.ones(G * M, T)
    old_logprobs = -torch.rand(G * M, T) * 4
    ids = torch.randint(4, len(tokenizer), (G * M, T))
    advantages = {name: group_advantages(rewards, name, tau=0.1) for name in ("softmax", "grpo")}
    token_advantages = advantages["softmax"].view(-1, 1) * mask
    ratio = (torch.randn(G * M, T) * 0.3).exp()
    low, high = step_page.clip_masks(ratio, token_advantages, mask)
    return step_page.StepRecord(
        config=config, step=7, pass_threshold=1.0, prompts=["x" * 10_000] * G, rewards=rewards,
        lengths=mask.sum(1).view(G, M), advantages=advantages, completion_ids=ids, mask=mask,
        old_logprobs=old_logprobs, ar_weight=reweight_advantages(torch.ones(G * M), old_logprobs.exp(), mask, 0.3),
        low=old_logprobs.exp() < 0.5, token_advantages=token_advantages, tokenizer=tokenizer, rollouts=None,
        ratio=ratio, clipped=low | high, stats={"optimizer_steps": 1})


def test_a_page_of_long_completions_stays_small_and_says_what_it_cut():
    text = step_page.page_html(long_record())
    assert len(text.encode()) < 400_000, len(text.encode())
    page = Page(text)
    assert len(page.rows) == 4 * 16  # GROUPS_SHOWN groups, COMPLETIONS_SHOWN each
    shown = step_page.tokens_shown_per_completion(len(page.rows))
    assert all(len(row["tokens"]) == shown for row in page.rows)
    assert text.count(f"… {5000 - shown} more tokens not shown") == len(page.rows) and "(cut)" in text
    more = step_page.page_html(long_record(M=32))
    assert len(more.encode()) < 400_000 and "16 more completions of this group not shown" in more


def test_the_groups_shown_are_the_hardest_a_mixed_the_easiest_and_one_without_signal():
    rewards = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float)
    assert step_page.chosen_groups(rewards, 1.0) == [("hardest", 2), ("mixed", 3), ("easiest", 4),
                                                        ("no signal", 1)]
    assert step_page.chosen_groups(torch.zeros(3, 4), 1.0) == [("hardest", 0)]  # all alike: one group


# --- the run's pages: train.py --inspect-every and the command on a checkpoint ------------------------------------
@pytest.fixture(scope="module")
def inspected_run(tmp_path_factory):
    """A 3-step digits run with --inspect-every 3 and every checkpoint kept; and the same run without the flag."""
    folder = tmp_path_factory.mktemp("inspect")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(tasks.TASKS, "digits", lambda data=None: DigitsTask())
        runs = {}
        for name, extra in (("with", ["--inspect-every", "3"]), ("without", [])):
            out = str(folder / name)
            train.main(["--task", "digits", "--output-dir", out, *SMALL, "--steps", "3", "--save-every", "2",
                        "--keep-checkpoints", "0", *extra])
            runs[name] = out
        yield runs, patch
    torch.set_num_threads(threads)


def test_train_writes_the_page_every_n_steps_and_nothing_else_changes(inspected_run):
    runs, _ = inspected_run
    with_flag, without = runs["with"], runs["without"]
    assert os.listdir(os.path.join(with_flag, "inspect")) == ["step-3.html"]
    assert sorted(os.listdir(with_flag)) == sorted(os.listdir(without) + ["inspect"])
    strip = lambda path: [{k: v for k, v in json.loads(line).items() if k not in run_module.TIMING_KEYS}  # noqa
                          for line in open(os.path.join(path, "metrics.jsonl"))]
    assert strip(with_flag) == strip(without)  # the page changes no number of the run
    settings = lambda path, step: {k: v for k, v in json.load(open(os.path.join(path, f"checkpoint-{step}",  # noqa
                                                                             "run.json"))).items()
                                   if k not in ("output_dir", "initial_policy")}  # the runs' own folders
    for step in (2, 3):
        assert filecmp.cmp(os.path.join(with_flag, f"checkpoint-{step}", "model.safetensors"),
                           os.path.join(without, f"checkpoint-{step}", "model.safetensors"), shallow=False)
        assert settings(with_flag, step) == settings(without, step)
    text = open(os.path.join(with_flag, "inspect", "step-3.html"), encoding="utf-8").read()
    row = strip(with_flag)[-2]  # step 3's train row (the eval row of step 3 is last)
    page = Page(text)
    assert row["step"] == 3 and 0 < len(page.rows) <= 8
    assert f"optimizer_steps {row['optimizer_steps']}" in text and f"clip_frac_low {row['clip_frac_low']:.4g}" in text
    for bad in ("http://", "https://", "src=", "href=", "<link", "<script", "@import", "url("):
        assert bad not in text.lower(), bad
    assert len(text.encode()) < 100_000


def test_the_command_resamples_the_same_step_from_the_checkpoint_before_it(inspected_run, tmp_path, capsys):
    runs, _ = inspected_run
    run_dir = runs["with"]
    listing = {name: os.path.getmtime(os.path.join(run_dir, name)) for name in os.listdir(run_dir)}
    output = str(tmp_path / "step3.html")
    assert inspect_step.main([os.path.join(run_dir, "checkpoint-2"), "--output", output]) == output
    assert "wrote " + output in capsys.readouterr().out
    ours, theirs = (open(path, encoding="utf-8").read() for path in (output, os.path.join(run_dir, "inspect",
                                                                                          "step-3.html")))
    meta = re.compile(r'<p class="meta">.*?</p>')
    assert meta.sub("", ours) == meta.sub("", theirs)  # the same rollouts, p_old, update and clip: the same page
    assert "sampled from checkpoint-2" in ours
    assert listing == {name: os.path.getmtime(os.path.join(run_dir, name)) for name in os.listdir(run_dir)}
    # a run folder: its latest checkpoint's next step, into the run's inspect/ folder
    path = inspect_step.main([run_dir])
    assert path == os.path.join(run_dir, "inspect", "step-4.html") and "Step 4" in open(path).read()
    os.remove(path)


def test_the_command_refuses_what_is_not_a_checkpoint_in_one_line(tmp_path, capsys):
    for argv, code in (([str(tmp_path / "missing")], 2), ([str(tmp_path)], 1)):
        with pytest.raises(SystemExit) as exit_info:
            inspect_step.main(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == code and "Traceback" not in err and len(err.strip().splitlines()) <= 2, err
        assert "experiments.inspect_step: error:" in err


def test_the_command_refuses_a_checkpoint_that_resume_refuses_in_one_line(inspected_run, tmp_path, capsys):
    # it re-spelled --resume's branch without the check of the optimizer state's shapes (and of bf16 master
    # weights): this state then failed in a traceback at the step's optimizer step; now both resume through
    # policy.restore_trainer_state
    runs, _ = inspected_run
    copy = str(tmp_path / "copy")
    shutil.copytree(runs["without"], copy, symlinks=True)
    path = os.path.join(copy, "checkpoint-2", "trainer_state.pt")
    state = torch.load(path, weights_only=True)
    first = next(iter(state["optimizer"]["state"].values()))
    first["exp_avg"] = first["exp_avg"].reshape(-1)[:3].clone()  # load_state_dict takes it (same count)
    torch.save(state, path)
    with pytest.raises(SystemExit) as exit_info:
        inspect_step.main([os.path.join(copy, "checkpoint-2"), "--output", str(tmp_path / "page.html")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "trainer_state.pt: its optimizer state does not fit this model" in err
    assert not os.path.exists(tmp_path / "page.html")


def test_inspect_every_is_not_saved_in_run_json_and_an_overwrite_deletes_the_pages(inspected_run, tmp_path):
    runs, _ = inspected_run
    assert "inspect_every" not in json.load(open(os.path.join(runs["with"], "latest", "run.json")))
    copy = str(tmp_path / "copy")
    shutil.copytree(runs["with"], copy, symlinks=True)
    remove_run(copy)  # what --overwrite does first
    assert not os.path.exists(os.path.join(copy, "inspect"))


@pytest.mark.slow
def test_the_page_renders_in_headless_chromium(inspected_run, tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    runs, _ = inspected_run
    page = os.path.join(runs["with"], "inspect", "step-3.html")
    shot = tmp_path / "page.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'p'}"]
    subprocess.run([CHROMIUM, *flags, f"--screenshot={shot}", "--window-size=1400,1200", f"file://{page}"],
                   check=True, capture_output=True, timeout=120)
    assert shot.stat().st_size > 20_000  # a drawn page, not a blank one
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", f"file://{page}"], check=True, capture_output=True,
                         timeout=120, text=True).stdout
    assert "Step 3: what the step did" in dom and len(Page(dom).rows) == len(Page(open(page).read()).rows)


def test_the_pages_prompt_wording_is_the_tasks_own(tmp_path, one_thread):
    # issue 64: a custom task's page said Countdown's "the numbers, >, the target, :"
    rewards = [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0]]
    record, model, _, _, stats = record_of_tiny_rollouts(rewards, style="compact")
    page = finished_page(record, model, stats, tmp_path)
    assert "Countdown" not in page and "the target" not in page
    assert f"(digits: e.g. &quot;{record.prompts[0].replace('>', '&gt;')}&quot;)" in page
    from tasks.countdown import CountdownTask
    record.task_name, record.task_wording = "countdown", CountdownTask.compact_wording
    assert "(countdown: the numbers, &quot;&gt;&quot;, the target" in finished_page(record, model, stats, tmp_path)


def test_the_pages_two_low_shares_say_what_each_counts(tmp_path, one_thread):
    # issue 64: the page showed Lopti's low share of all tokens beside the loss's lopti_low_share (of the rows that
    # can learn) with nothing to tell them apart; now the second is computed on the page too, and equals the loss's
    record, model, _, _, stats = record_of_tiny_rollouts([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]], lr=1e-3,
                                                          lopti_eta=0.5)
    page = finished_page(record, model, stats, tmp_path)
    assert record.advantages[record.config.method][1].eq(0).all()  # the tied group: its rows cannot learn
    expected = step_page.learning_low_share(record)
    assert abs(expected - stats["lopti_low_share"]) < 1e-6
    assert f"the loss's lopti_low_share): {expected:.1%}" in page
