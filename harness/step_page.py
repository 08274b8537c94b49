"""One RL step, seen: a self-contained HTML page of what the step did to a handful of its groups (--inspect-every;
the command: experiments/inspect_step.py).

What it shows: docs/runs.md, "See one step". Every number comes from the lesson's functions: a
view, not a second implementation. No script, no link: it opens offline (TOKENS_SHOWN bounds it).
"""
import dataclasses
import html
import math
import os

import torch

from harness.files import RunError, refuse_link, replaced_file, what_is, write_failed
from lopti import isolation_masks, reweight_advantages
from ppo import clip_masks
from rollout import precision, token_logprobs
from softmax_grpo import grpo_prompt_weight, group_advantages, prompt_weight

SHOWN_ALPHA, SHOWN_ETA = 0.3, 0.5  # AR's and Lopti's paper values, shown when the run has them off
GROUPS_SHOWN = 4                   # hardest, mixed, easiest, one without signal (fewer when they coincide)
COMPLETIONS_SHOWN = 16             # per group; a larger M shows its first 16
TOKENS_SHOWN = 2400                # completion tokens on the whole page (~95 bytes each): the page's size bound
MIN_TOKENS_SHOWN = 16              # per completion, however many rows
TOKEN_CHARS = 24                   # characters shown of one token's text
PROMPT_CHARS = 400                 # characters shown of a prompt
NAMES = {"softmax": "SoftmaxGRPO", "grpo": "GRPO"}


@dataclasses.dataclass
class StepRecord:
    """What the page shows of one step (on the CPU); ratio, clipped, stats: after the update."""
    config: object
    step: int
    pass_threshold: float
    prompts: list                # [G] prompt text
    rewards: torch.Tensor
    lengths: torch.Tensor
    advantages: dict
    completion_ids: torch.Tensor
    mask: torch.Tensor
    old_logprobs: torch.Tensor
    ar_weight: torch.Tensor
    low: torch.Tensor
    token_advantages: torch.Tensor
    tokenizer: object
    rollouts: object             # rollout.Rollouts, scored again after the update
    ratio: torch.Tensor = None
    clipped: torch.Tensor = None
    stats: dict = None
    source: str = ""
    task_name: str = ""          # the task's name and, where it has one, its compact_wording (the prompt's format)
    task_wording: str = ""


def shown_alpha_eta(config):
    return config.alpha or SHOWN_ALPHA, config.lopti_eta or SHOWN_ETA


def estimators(method):
    return [method] + [name for name in ("grpo", "softmax") if name != method]


def sampled_logprobs(model, rollouts, config):
    """log pi(o_t) of the rollouts' tokens [B, T] under `model`, as update_policy scores pi_old (the same call)."""
    device = next(model.parameters()).device
    dtype = "fp32" if config.logprob_fp32 else config.dtype  # --logprob-fp32: no autocast, as update_batch
    with torch.no_grad(), precision(device, dtype):
        return token_logprobs(model, rollouts.input_ids.to(device), rollouts.attention_mask.to(device),
                              rollouts.completion_mask.to(device).float(), temperature=config.temperature,
                              micro_batch=config.micro_batch, logit_chunk=config.logit_chunk).float().cpu()


def before_update(config, step, model, tokenizer, task, rollouts, rewards, *, due=None, source=""):
    """The step's record before its update; None when --inspect-every skips it (`due` overrides)."""
    if not (due if due is not None else config.inspect_every and step % config.inspect_every == 0):
        return None
    M = config.num_generations
    mask = rollouts.completion_mask.float().cpu()
    group_rewards = rewards.float().cpu().view(-1, M)                       # [G, M]
    lengths = mask.sum(1).view_as(group_rewards)
    advantages = {name: group_advantages(group_rewards, name, tau=config.tau, lengths=lengths)
                  for name in estimators(config.method)}
    old_logprobs = sampled_logprobs(model, rollouts, config)
    old_probs = old_logprobs.exp()
    run_advantages = advantages[config.method].view(-1)
    token_advantages = run_advantages[:, None] * mask if config.alpha == 0 else \
        reweight_advantages(run_advantages, old_probs, mask, config.alpha)  # what the update trains on
    alpha, eta = shown_alpha_eta(config)
    ar_weight = reweight_advantages(torch.ones(len(mask)), old_probs, mask, alpha)  # alpha p_old + 1 - alpha
    low, _ = isolation_masks(old_probs, mask, eta)
    ids, attention = rollouts.input_ids.cpu(), rollouts.attention_mask.cpu()
    prompt_width = ids.shape[1] - mask.shape[1]
    prompts = ids[::M, :prompt_width].masked_fill(attention[::M, :prompt_width] == 0, tokenizer.pad_token_id)
    return StepRecord(config=config, step=step, pass_threshold=task.pass_threshold,
                      prompts=tokenizer.batch_decode(prompts, skip_special_tokens=True), rewards=group_rewards,
                      lengths=lengths, advantages=advantages, completion_ids=ids[:, prompt_width:], mask=mask,
                      old_logprobs=old_logprobs, ar_weight=ar_weight, low=low, token_advantages=token_advantages,
                      tokenizer=tokenizer, rollouts=rollouts, source=source, task_name=getattr(task, "name", ""),
                      task_wording=getattr(task, "compact_wording", ""))


def after_update(record, model, stats, *, path=None):
    if record is None:
        return None
    new_logprobs = sampled_logprobs(model, record.rollouts, record.config)
    record.ratio = (new_logprobs - record.old_logprobs).exp()
    low_clip, high_clip = clip_masks(record.ratio, record.token_advantages, record.mask,
                                     clip_low=record.config.clip_low, clip_high=record.config.clip_high)
    record.clipped, record.stats = low_clip | high_clip, stats
    path = path or os.path.join(refuse_link(os.path.join(record.config.output_dir, "inspect"), elsewhere=""),
                                f"step-{record.step}.html")
    write_page(path, page_html(record))
    return path


def write_page(path, text):
    folder = os.path.dirname(os.path.abspath(path))
    if what_is(folder) not in (None, "a directory"):  # planted during the run: named, not "File exists"
        raise RunError(f"{folder} is {what_is(folder)}, where the step's pages go; move it away")
    try:
        os.makedirs(folder, exist_ok=True)
        with replaced_file(path) as f:
            f.write(text)
    except OSError as error:
        raise RunError(write_failed(f"the step's page {path}", error, otherwise="", elsewhere="")) from None


def chosen_groups(rewards, pass_threshold):
    passed = (rewards >= pass_threshold).float().mean(1).tolist()
    mean = rewards.mean(1).tolist()
    signal = (rewards.amax(1) != rewards.amin(1)).tolist()
    groups = range(len(rewards))
    with_signal = [g for g in groups if signal[g]] or list(groups)
    picks = [("hardest", min(with_signal, key=lambda g: (passed[g], mean[g]))),
             ("mixed", min(with_signal, key=lambda g: (abs(passed[g] - 0.5), -mean[g]))),
             ("easiest", max(groups, key=lambda g: (passed[g], mean[g])))]
    picks += [("no signal", g) for g in groups if not signal[g]][:1]
    first = {}
    for role, g in picks:
        first.setdefault(g, role)  # each group once
    return [(role, g) for g, role in first.items()][:GROUPS_SHOWN]


STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:18px 28px;color:#1d1d1f;max-width:1340px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:22px 0 4px}
.meta{color:#555;margin:0 0 10px}.note{color:#555;font-size:12.5px}
table{border-collapse:collapse;margin:4px 0}td,th{padding:2px 7px;text-align:right;vertical-align:top}
th{font-weight:600;border-bottom:1px solid #bbb;background:#f4f4f6}tr.row td{border-bottom:1px solid #eee}
td.tok{text-align:left;font:15px/1.9 ui-monospace,Menlo,Consolas,monospace;white-space:pre-wrap;word-break:break-all}
td.tok span{padding:0 1px}
.summary td{text-align:left}.prompt{font:13px ui-monospace,Menlo,monospace;background:#f4f4f6;padding:2px 6px;
white-space:pre-wrap;word-break:break-all}
.pos{color:#0a6b2d}.neg{color:#b3261e}.pass{font-weight:600}
.lo{border-bottom:3px solid #1f4fd1}.cl{outline:2px solid #000;outline-offset:-1px}
.more{color:#777;font-style:italic}.legend span{padding:1px 6px;margin-right:2px}
.flex{display:flex;gap:36px;flex-wrap:wrap;align-items:flex-start}
""" + "".join(f".p{i}{{background:hsl({13 * i},85%,{66 + 2 * i}%)}}" for i in range(10))  # red (p_old < .1) .. green


def esc(text):
    return html.escape(str(text), quote=True)


def number(value, digits=3):
    kind = "pos" if value > 0 else "neg" if value < 0 else ""
    return f'<span class="{kind}">{value:+.{digits}f}</span>'


def token_span(text, p_old, weight, low, ratio, clipped):
    shown = text if len(text) <= TOKEN_CHARS else text[:TOKEN_CHARS] + "…"
    title = f"p_old {p_old:.3f}, AR weight {weight:.3f}, Lopti {'low' if low else 'high'}, ratio {ratio:.3f}" + \
        (" (clipped)" if clipped else "")
    classes = f"p{min(9, int(p_old * 10))}" + (" lo" if low else "") + (" cl" if clipped else "")
    return f'<span class="{classes}" title="{esc(title)}">{esc(shown)}</span>'


def tokens_shown_per_completion(rows):
    return max(MIN_TOKENS_SHOWN, TOKENS_SHOWN // max(rows, 1))


def histogram_svg(series, bins=21, width=560, height=150):
    """Inline SVG bars: the step's completion advantages under each estimator, bins over their common range."""
    values = torch.cat([v.flatten() for v in series.values()])
    low, high = float(values.min()), float(values.max())
    if high - low < 1e-9:
        low, high = low - 1, high + 1
    edges = [low + (high - low) * i / bins for i in range(bins + 1)]
    counts = {name: torch.histc(v.flatten().float(), bins=bins, min=low, max=high).tolist()
              for name, v in series.items()}
    tallest = max(max(c) for c in counts.values()) or 1
    colours = ["#1f4fd1", "#e8833a", "#6a9a1f"]
    plot_h, left, bar_w = height - 34, 34, (width - 40) / bins
    parts = [f'<svg width="{width}" height="{height}" role="img">',  # inline SVG: no namespace needed
             f'<text x="2" y="12" font-size="11">{int(tallest)}</text>',
             f'<text x="2" y="26" font-size="10" fill="#666">rows</text>',
             f'<line x1="{left}" y1="{plot_h}" x2="{width - 4}" y2="{plot_h}" stroke="#888"/>']
    for s, (name, count) in enumerate(counts.items()):
        w = bar_w / len(counts)
        for b, c in enumerate(count):
            if c:
                h = plot_h * c / tallest
                parts.append(f'<rect x="{left + b * bar_w + s * w:.1f}" y="{plot_h - h:.1f}" width="{w - 0.5:.1f}" '
                             f'height="{h:.1f}" fill="{colours[s % 3]}"><title>{esc(NAMES.get(name, name))}: '
                             f'{int(c)} in [{edges[b]:+.2f}, {edges[b + 1]:+.2f})</title></rect>')
        parts.append(f'<rect x="{left + 150 * s}" y="{height - 12}" width="10" height="10" fill="{colours[s % 3]}"/>'
                     f'<text x="{left + 150 * s + 14}" y="{height - 3}" font-size="11">'
                     f'{esc(NAMES.get(name, name))}</text>')
    for x, label in ((left, f"{low:+.2f}"), (width - 40, f"{high:+.2f}")):
        parts.append(f'<text x="{x}" y="{plot_h + 13}" font-size="11">{label}</text>')
    if low <= 0 <= high:  # A = 0: no push either way (a tied group's rows all sit here)
        zero = left + (width - 40) * (0 - low) / (high - low)
        parts.append(f'<line x1="{zero:.1f}" y1="0" x2="{zero:.1f}" y2="{plot_h}" stroke="#aaa" '
                     f'stroke-dasharray="3,3"/><text x="{zero + 3:.1f}" y="10" font-size="11" fill="#555">A = 0</text>')
    return "".join(parts) + "</svg>"


def budget_shares(record):
    shares = {}
    for name, advantages in record.advantages.items():
        budget = (advantages.abs() * record.lengths).sum(1)
        shares[name] = budget / budget.sum() if budget.sum() > 0 else torch.zeros_like(budget)
    return shares


def learning_low_share(record):
    mask = record.mask.bool()
    active = (record.advantages[record.config.method].flatten() != 0) | (record.config.kl_coef > 0)
    return float(record.low[active].sum() / mask[active].sum().clamp_min(1))


def step_section(record):
    config, stats, mask = record.config, record.stats or {}, record.mask.bool()
    valid, low, beyond = int(mask.sum()), int(record.low.sum()), int(record.clipped.sum())
    G, M = record.rewards.shape
    passing = float((record.rewards >= record.pass_threshold).float().mean())
    ar = f"AR α = {config.alpha:g}" if config.alpha else f"AR off (weights shown at α = {SHOWN_ALPHA:g})"
    lopti = f"Lopti η = {config.lopti_eta:g} ({config.lopti_order})" if config.lopti_eta else \
        f"Lopti off (passes shown at η = {SHOWN_ETA:g})"
    rows = [("prompts × completions", f"{G} × {M} = {G * M}, {valid} completion tokens"),
            ("method", f"{esc(NAMES.get(config.method, config.method))}, τ = {config.tau:g}; {ar}; {lopti}"),
            ("reward", f"mean {float(record.rewards.mean()):.3f}; {passing:.0%} of the completions pass (reward "
                       f"≥ {record.pass_threshold:g})"),
            (f"Lopti passes (η = {shown_alpha_eta(config)[1]:g})",
             f"low (p_old &lt; η): {low / max(valid, 1):.1%} of the tokens; high: "
             f"{(valid - low) / max(valid, 1):.1%}; low among the tokens of rows that can learn (a non-zero "
             f"advantage{', or the KL term' if config.kl_coef > 0 else ''}; the loss's lopti_low_share): "
             f"{learning_low_share(record):.1%}"),
            ("the loss (update_policy)", ", ".join(f"{key} {stats[key]:.4g}" for key in
                                                   ("optimizer_steps", "clip_frac_low", "clip_frac_high",
                                                    "ratio_max", "lopti_low_share") if key in stats) or "—"),
            ("beyond the clip after the step", f"{beyond} tokens ({beyond / max(valid, 1):.2%}): ratio "
             f"π_after/π_old outside [{1 - config.clip_low:g}, {1 + config.clip_high:g}] on the side its "
             "advantage pushes (boxed below)")]
    table = "".join(f"<tr><th>{label}</th><td>{value}</td></tr>" for label, value in rows)
    histogram = histogram_svg({name: record.advantages[name] for name in estimators(config.method)[:2]})
    return (f'<div class="flex"><table class="summary">{table}</table><div><b>Advantages of the step\'s '
            f'{G * M} completions</b><br>{histogram}</div></div>')


def legend():
    bins = "".join(f'<span class="p{i}">{i / 10:.1f}</span>' for i in range(10))
    return (f'<p class="legend">p_old of each token: {bins} (red: unlikely, green: likely). '
            '<span class="lo">underlined</span>: Lopti\'s low-probability pass (p_old &lt; η; trained first). '
            '<span class="cl">boxed</span>: the clip holds its ratio after the step. Hover a token: p_old, '
            'AR\'s weight α·p_old + 1 − α, its Lopti pass, its ratio π_after/π_old.</p>')


def group_section(record, role, g, shares, per_completion):
    config, M = record.config, record.rewards.shape[1]
    rewards = record.rewards[g]
    k = int((rewards >= record.pass_threshold).sum())
    p = k / M
    names = estimators(config.method)
    share_text = ", ".join(f"{esc(NAMES.get(n, n))} {float(shares[n][g]):.1%}" for n in names)
    summary = (f"<b>{k} of {M}</b> succeeded (pass rate {p:.3f}); ω<sub>M,τ</sub>({p:.3f}) = "
               f"{prompt_weight(p, M, config.tau):.3f} (SoftmaxGRPO's weight on ∇p; GRPO's "
               f"{grpo_prompt_weight(p, M):.3f}); budget share Σ|A|·len: {share_text}")
    if float(rewards.max()) == float(rewards.min()):
        summary += (". <i>No signal:</i> every completion got the same reward, so every advantage is exactly 0 and "
                    "this group adds nothing to the update (only the KL term, if on). ω is the expected weight of a "
                    f"prompt whose pass rate is {p:.3f}, averaged over the groups it would draw; this draw tied")
    head = "".join(f"<th>A {esc(NAMES.get(n, n))}</th>" for n in names)
    rows = []
    for j in range(min(M, COMPLETIONS_SHOWN)):
        b = g * M + j
        valid = int(record.mask[b].sum())
        texts = record.tokenizer.batch_decode([[i] for i in record.completion_ids[b, :per_completion].tolist()])
        spans = [token_span(texts[t], math.exp(record.old_logprobs[b, t]), float(record.ar_weight[b, t]),
                            bool(record.low[b, t]), float(record.ratio[b, t]), bool(record.clipped[b, t]))
                 for t in range(min(valid, per_completion))]
        if valid > per_completion:
            spans.append(f'<span class="more"> … {valid - per_completion} more tokens not shown</span>')
        advantage_cells = "".join(f"<td>{number(float(record.advantages[n][g, j]))}</td>" for n in names)
        data = " ".join(f'data-adv-{n.replace("_", "-")}="{float(record.advantages[n][g, j])!r}"' for n in names)
        passed = ' class="pass"' if rewards[j] >= record.pass_threshold else ""
        rows.append(f'<tr class="row" data-group="{g}" data-reward="{float(rewards[j])!r}" {data}><td>{j + 1}</td>'
                    f'<td{passed}>{float(rewards[j]):.3f}</td>{advantage_cells}<td>{valid}</td>'
                    f'<td class="tok">{"".join(spans)}</td></tr>')
    if M > COMPLETIONS_SHOWN:
        rows.append(f'<tr><td></td><td colspan="9" class="more">… {M - COMPLETIONS_SHOWN} more completions of this '
                    'group not shown</td></tr>')
    prompt = record.prompts[g]
    prompt = prompt if len(prompt) <= PROMPT_CHARS else prompt[:PROMPT_CHARS] + " … (cut)"
    return (f'<section class="group" id="group-{g}"><h2>{esc(role)}: group {g + 1} of {len(record.rewards)}</h2>'
            f'<div>prompt <span class="prompt">{esc(prompt)}</span></div><p>{summary}</p>'
            f'<table><tr><th>#</th><th>reward</th>{head}<th>tokens</th><th style="text-align:left">completion '
            f'(coloured by p_old)</th></tr>{"".join(rows)}</table></section>')


def prompt_format(record):
    """The compact prompt format, if the run uses it: the task's compact_wording or an example."""
    if record.config.style != "compact":
        return ""
    example = record.prompts[0] if record.prompts else ""
    told = record.task_wording or (f'e.g. "{example if len(example) <= PROMPT_CHARS else example[:PROMPT_CHARS]}"'
                                   if example else "")
    name = record.task_name or "the task"
    return ('<p class="note">Prompts are in the compact style, as the tiny model reads them: the task\'s prompt on '
            f'one line, lower case, one character per token{esc(f" ({name}: {told})" if told else "")}. Chat-style '
            'runs show the last user message.</p>')


def page_html(record):
    chosen = chosen_groups(record.rewards, record.pass_threshold)
    shown_rows = sum(min(record.rewards.shape[1], COMPLETIONS_SHOWN) for _ in chosen)
    per_completion = tokens_shown_per_completion(shown_rows)
    shares = budget_shares(record)
    groups = "".join(group_section(record, role, g, shares, per_completion) for role, g in chosen)
    config = record.config
    source = f" — {esc(record.source)}" if record.source else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>step {record.step}: what the step '
            f'did</title><style>{STYLE}</style></head><body><h1>Step {record.step}: what the step did</h1>'
            f'<p class="meta">{esc(config.output_dir)}{source}; task {esc(os.path.basename(str(config.task)))}, model '
            f'{esc(os.path.basename(str(config.model)))}, seed {config.seed}. Made by harness/step_page.py; '
            f'how to read it: docs/runs.md, “See one step”.</p>{prompt_format(record)}{step_section(record)}'
            f'{legend()}{groups}'
            f'<p class="note">Rewards ≥ {record.pass_threshold:g} count as a success (bold). ω<sub>M,τ</sub> is '
            'Eq. (4)\'s '
            'weight for binary rewards (softmax_grpo.prompt_weight). Advantages are group_advantages of the same '
            'rewards; the run trained on its own method\'s (first column), scaled per token by AR when α &gt; 0.</p>'
            '</body></html>')
