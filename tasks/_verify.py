"""Helpers shared by the task files: the compact alphabet, tag extraction (ours and the official SoftmaxGRPO
final_text), the think/answer format check, the rules-name check, the chat system prompts (ours and the official
\\boxed{} math prompt) and the TRL-style batch wrapper.

Everything here works on plain strings with str.find / str.rfind and linear regexes, so a hostile
100 000-character completion costs a few milliseconds and nothing is ever evaluated as code.
"""

import re

# Every character of a compact prompt or solution is one of these (the tiny char model's vocabulary).
COMPACT_ALPHABET = "\n ()*+,-./0123456789:=>abcdefghijklmnopqrstuvwxyz"
_COMPACT_SET = frozenset(COMPACT_ALPHABET)

# The papers' instruct template: reason inside <think>, answer inside <answer>.
SYSTEM_PROMPT = (
    "You are a helpful assistant. You first reason about the problem step by step, then give the user "
    "the final answer. Write the reasoning inside <think> </think> tags and the final answer inside "
    "<answer> </answer> tags, i.e. <think> reasoning here </think> <answer> answer here </answer>."
)


# The math tasks' answer styles (option answer_style), default first: "tags" asks for <think>/<answer> as the
# system prompt above does; "boxed" is the official SoftmaxGRPO GSM8K / DeepMath prompt (prepare_data.py): a short
# system line and, after the question, the request for a \boxed{} answer; no tags are mentioned.
ANSWER_STYLES = ("tags", "boxed")
BOXED_SYSTEM_PROMPT = "You are a helpful assistant. Think through the problem before providing the answer."
BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def chat_messages(user_text, system=SYSTEM_PROMPT):
    """The chat-style prompt: a system message (the think/answer one unless told) plus one user message."""
    return [{"role": "system", "content": system}, {"role": "user", "content": user_text}]


def text_prompt(text, instruction, style, system=SYSTEM_PROMPT):
    """The prompt of a data task (a question or request in `text`): compact "<text>:" for the tiny char model, or
    chat_messages(system) with `instruction` on the line after the text."""
    if style == "compact":
        return compact_text(text) + ":"
    if style != "chat":
        raise ValueError(f"style must be 'chat' or 'compact', got {style!r}")
    return chat_messages(f"{text}\n{instruction}", system)


def math_prompt(question, tags_instruction, style, answer_style):
    """The prompt of a math task: with answer_style "tags", our system prompt and `tags_instruction`; with
    "boxed", the official SoftmaxGRPO system line and BOXED_INSTRUCTION. Compact style ignores answer_style."""
    if answer_style == "boxed":
        return text_prompt(question, BOXED_INSTRUCTION, style, BOXED_SYSTEM_PROMPT)
    return text_prompt(question, tags_instruction, style)


def check_answer_style(task, answer_style):
    """One-line error for an unknown answer_style of `task`."""
    if answer_style not in ANSWER_STYLES:
        raise ValueError(f"{task}: unknown answer_style {answer_style!r}; choose from "
                         f"{', '.join(repr(c) for c in ANSWER_STYLES)}")
    return answer_style


def compact_text(text):
    """Lower-case `text` and map every character outside COMPACT_ALPHABET to a space (runs collapsed)."""
    mapped = "".join(c if c in _COMPACT_SET and c != "\n" else " " for c in text.lower())
    return " ".join(mapped.split())


def completion_text(completion):
    """The text of one completion: a plain string, or TRL's conversational form
    [{"role": "assistant", "content": ...}] (the last message's content is used)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    if isinstance(completion, (list, tuple)) and completion:
        last = completion[-1]
        return str(last.get("content", "")) if isinstance(last, dict) else str(last)
    return ""


def last_tag_block(text, tag="answer"):
    """Content of the last <tag>...</tag> in `text`, or None. O(len(text)), no regex."""
    close = text.rfind(f"</{tag}>")
    if close < 0:
        return None
    start = text.rfind(f"<{tag}>", 0, close)
    if start < 0:
        return None
    return text[start + len(tag) + 2:close]


def think_answer_in_order(text):
    """True when `text` holds exactly one each of <think>, </think>, <answer>, </answer>, in that order (the
    Logic-RL / AR-Lopti structure check, as it is)."""
    tags = ("<think>", "</think>", "<answer>", "</answer>")
    if any(text.count(tag) != 1 for tag in tags):
        return False
    positions = [text.find(tag) for tag in tags]
    return positions == sorted(positions)


def has_think_answer_format(text):
    """True when `text` holds exactly one <think>...</think> followed by exactly one <answer>...</answer>.

    A completion that starts inside the think block counts as if "<think>" were there: chat templates of
    reasoning models pre-fill it in the prompt (ours: it passes completions written with or without a pre-filled
    "<think>"; knights_knaves' think_prefill option checks the official way instead)."""
    if text.count("<think>") == 0 and text.count("</think>") == 1:
        text = "<think>" + text
    return think_answer_in_order(text)


def tag_blocks_last(text, tag="answer"):
    """Content of the last <tag>...</tag> pair as re.findall(r"<tag>(.*?)</tag>", text, re.DOTALL) pairs them
    (each opening tag with the first closing tag after it, scanning left to right), or None. Linear time: the
    regex itself is quadratic on many unclosed opening tags."""
    opening, closing = f"<{tag}>", f"</{tag}>"
    found, start = None, text.find(opening)
    while start >= 0:
        end = text.find(closing, start + len(opening))
        if end < 0:
            break
        found = text[start + len(opening):end]
        start = text.find(opening, end + len(closing))
    return found


def final_text(text):
    """The official SoftmaxGRPO answer text: chat end tokens removed, the text after the last </think>, then its
    last <answer>...</answer> block if it has one, else all of it; whitespace stripped. An answer given only
    inside <think> does not count."""
    text = text.replace("<|im_end|>", "").replace("<|endoftext|>", "").strip()
    end_think = text.rfind("</think>")
    if end_think >= 0:
        text = text[end_think + len("</think>"):].strip()
    block = tag_blocks_last(text)
    return (text if block is None else block).strip()


def check_rules(task, rules, choices):
    """One-line error for an unknown `rules` name of `task`; `choices` lists the known ones, default first."""
    if rules not in choices:
        raise ValueError(f"{task}: unknown rules {rules!r}; choose from {', '.join(repr(c) for c in choices)}")
    return rules


def answer_region(text):
    """Where a chat completion's answer lives: the last <answer> block, else the text after the last </think>,
    else the whole completion."""
    block = last_tag_block(text)
    if block is not None:
        return block
    end_think = text.rfind("</think>")
    return text[end_think + len("</think>"):] if end_think >= 0 else text


_ASCII_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")
MAX_NUMBER_SCAN = 20_000  # the last number is looked for in the last 20 000 characters only (~1 ms)


def last_number(text):
    """The last ASCII number in the last MAX_NUMBER_SCAN characters of `text` (commas kept; the caller
    normalises), or None. Linear-time regex, tried on the last 1000 characters first (a match touching that
    window's edge may be cut: rescan the longer window)."""
    for tail in (text[-1000:], text[-MAX_NUMBER_SCAN:]):
        last = None
        for last in _ASCII_NUMBER.finditer(tail):
            pass
        if last is not None and (last.start() > 0 or len(tail) >= min(len(text), MAX_NUMBER_SCAN)):
            return last.group(0)
    return None


def rewards_from_columns(reward, completions, columns, fields, style="chat"):
    """TRL GRPOTrainer-style batch reward: completions[i] is scored against the example rebuilt from
    columns[field][i] for every field of the task's examples (extra columns such as `prompts` are ignored)."""
    missing = [f for f in fields if f not in columns]
    if missing:
        raise ValueError(f"reward_fn: missing example column(s) {missing}; pass the dataset columns as keywords")
    for field in fields:
        if len(columns[field]) != len(completions):
            raise ValueError(f"reward_fn: column '{field}' has {len(columns[field])} rows, "
                             f"expected {len(completions)} (one per completion)")
    return [float(reward(completion_text(c), {f: columns[f][i] for f in fields}, style=style))
            for i, c in enumerate(completions)]
