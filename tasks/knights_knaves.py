"""Knights and Knaves: knights always tell the truth, knaves always lie; find who is who.

Generator (tasks/knights_knaves_logic.py), reward, `think_prefill` and the rule sets (`logic_rl`,
the official Logic-RL / AR-Lopti scorer, default; `lenient`, ours): DESIGN.md §6. Reward: format +1
/ -1, answer +2 right, -1.5 read but wrong, -2 unreadable or bad format (top score 3); the binary
variant gives 1.0 for the top score.

Compact style: people are letters a, b, c, ...; a leaf is "b1" (b is a knight) or "b0" (b is a
knave); "-" is not, "*" and, "+" or, ">" implies, "=" iff. Prompt "a:b1*c0,b:-a1,c:a1>b0." ->
solution "101".

Data file (data=PATH; the generator is the default): Logic-RL's K&K rows (`quiz`,
`solution_text_format`; parquet or JSONL) or verl rows (ground_truth with `solution_text_format`),
docs/tasks.md. A rendered prompt (example["rendered_prompt"]) is scored as kk.py scores it, whatever
think_prefill says.
"""

import random
import re
import zlib
from dataclasses import dataclass, field

from tasks._data import last_user_text, load_splits, sample_rows
from tasks.knights_knaves_logic import generate_statements, solutions
from tasks._verify import chat_messages, check_rules, completion_text, has_think_answer_format, last_tag_block, \
    rewards_from_columns, think_answer_in_order

NAMES = ("alice", "bob", "charlie", "david", "emma", "frank", "grace", "henry", "isabella", "jack", "kate",
         "liam", "mia", "noah", "olivia", "peter", "quinn", "ruby", "samuel", "tara", "uma", "victor",
         "william", "xena", "yusuf", "zoey", "aiden", "bella", "caleb", "daisy", "ethan", "fiona", "george",
         "hannah", "oscar", "penelope", "lucas", "sofia", "mason", "chloe")
COMPACT_OP = {"and": "*", "or": "+", "imp": ">", "iff": "="}
LETTERS = "abcdefgh"
MAX_ANSWER_CHARS = 2000  # lenient rules: longer answers are unparseable
RULES = ("logic_rl", "lenient")  # chat-style rule sets, default first
TEST_EVERY = 10  # a puzzle is in the test split when hash(puzzle) % TEST_EVERY == 0


# Rendering: chat text with names and varied sentence templates, and the compact code.
_SAYS = ('{name} says, "{s}."', '{name} tells you: "{s}."', '"{s}," claims {name}.', 'According to {name}, "{s}."',
         '{name} states: "{s}."', 'In {name}\'s words: "{s}."')
_NOT = ("it is not the case that {a}", "it is false that {a}")
_BINARY = {"and": ("{a} and {b}",), "or": ("{a} or {b}", "either {a} or {b}"),
           "imp": ("if {a} then {b}", "{b} if {a}"), "iff": ("{a} if and only if {b}",)}


def _render(statement, speaker, names, rng):
    kind = statement[0]
    if kind == "is":
        role = "a knight" if statement[2] else "a knave"
        return f"I am {role}" if statement[1] == speaker else f"{names[statement[1]].capitalize()} is {role}"
    if kind == "not":
        return rng.choice(_NOT).format(a=_render(statement[1], speaker, names, rng))
    return rng.choice(_BINARY[kind]).format(a=_render(statement[1], speaker, names, rng),
                                            b=_render(statement[2], speaker, names, rng))


def _compact(statement):
    kind = statement[0]
    if kind == "is":
        return f"{LETTERS[statement[1]]}{int(statement[2])}"
    if kind == "not":
        return "-" + _compact(statement[1])
    return _compact(statement[1]) + COMPACT_OP[kind] + _compact(statement[2])


def decode_compact(code):
    """Statements back from the compact code "a:b1*c0,b:-a1,c:a1>b0." (inverse of the rendering)."""
    op_of = {v: k for k, v in COMPACT_OP.items()}
    statements = []
    for part in code.rstrip(".").split(","):
        body = part.split(":", 1)[1]
        if body.startswith("-"):
            statements.append(("not", ("is", LETTERS.index(body[1]), body[2] == "1")))
        elif len(body) == 2:
            statements.append(("is", LETTERS.index(body[0]), body[1] == "1"))
        else:
            statements.append((op_of[body[2]], ("is", LETTERS.index(body[0]), body[1] == "1"),
                               ("is", LETTERS.index(body[3]), body[4] == "1")))
    return statements


def answer_text(names, knights):
    """Ground truth in the papers' format: "(1) Alice is a knight\\n(2) Bob is a knave"."""
    return "\n".join(f"({i + 1}) {name.capitalize()} is a {'knight' if k else 'knave'}"
                     for i, (name, k) in enumerate(zip(names, knights)))


def make_example(rng, n):
    """One puzzle as a flat dict of JSON-able values (usable as dataset columns)."""
    statements = generate_statements(rng, n)
    names = rng.sample(NAMES, n)
    knights = solutions(statements)[0]
    listed = ", ".join(name.capitalize() for name in names[:-1]) + f" and {names[-1].capitalize()}"
    lines = []
    for i, statement in enumerate(statements):
        sentence = _render(statement, i, names, rng)
        lines.append(rng.choice(_SAYS).format(name=names[i].capitalize(), s=sentence[0].upper() + sentence[1:]))
    puzzle = (f"An island is inhabited only by knights, who always tell the truth, and knaves, who always lie. "
              f"You meet {n} inhabitants: {listed}. " + " ".join(lines))
    code = ",".join(f"{LETTERS[i]}:{_compact(s)}" for i, s in enumerate(statements)) + "."
    return {"puzzle": puzzle, "names": names, "knights": knights, "compact": code,
            "answer": answer_text(names, knights)}


# Parsing a model's answer.
_WORD = re.compile(r"[a-z]+")


def parse_roles(answer, names):
    """{name: is_knight} from free text such as "(1) Alice is a knight\\n(2) Bob is a knave", names in any
    order, case-insensitive; each role word is tied to the nearest name before it ("not" between them flips
    it). None when the number of role words differs from the number of people or a name is missing/doubled."""
    if len(answer) > MAX_ANSWER_CHARS:
        return None
    words = _WORD.findall(answer.lower())
    if sum(w in ("knight", "knave", "knights", "knaves") for w in words) != len(names):
        return None
    roles, name_set, current, negated = {}, set(names), None, False
    for word in words:
        if word in name_set:
            current, negated = word, False
        elif word == "not" and current is not None:
            negated = not negated
        elif word in ("knight", "knave", "knights", "knaves"):
            if current is None or current in roles:
                return None
            roles[current] = word.startswith("knight") != negated
            current = None
    return roles if len(roles) == len(names) else None


def logic_rl_roles(answer, names):
    """{name: is_knight} read as the Logic-RL scorer reads an answer, or None: the answer must hold exactly
    len(names) case-insensitive substrings "knight" or "knave" (so "knights" counts), and for every name the
    first match of "<name> is a knight|knave" (whole words, any whitespace, any case) gives its role. Regexes
    here are linear, so a long answer costs one pass per name."""
    lowered = answer.lower()
    if lowered.count("knight") + lowered.count("knave") != len(names):
        return None
    roles = {}
    for name in names:
        match = re.search(rf"\b{re.escape(name)}\b\s+is\s+a\s+\b(knight|knave)\b", answer, re.IGNORECASE)
        if match is None:
            return None
        roles[name] = match.group(1).lower() == "knight"
    return roles


THINK_PREFILL = "<think>"  # what the official K&K prompts put after the assistant header
_HEADERS = ("Assistant:", "<|im_start|>assistant")  # where kk.py starts the response, first found first


def logic_rl_processed(text):
    """What kk.py keeps of the decoded prompt + response `text`: after the first "Assistant:", else after the
    first "<|im_start|>assistant"; None when neither is there (kk.py: no answer, format checked on all of it)."""
    for header in _HEADERS:
        if header in text:
            return text.split(header, 1)[1]
    return None


def logic_rl_response(completion, prefill=THINK_PREFILL):
    """The text the Logic-RL / AR-Lopti scorer validates for `completion` when a chat-template
    prompt ended in `prefill`: prefill + completion, or only what follows the completion's first
    "Assistant:" (logic_rl_processed on the whole; its leading newline changes no tag count)."""
    text = prefill + completion
    cut = text.find("Assistant:")
    return text if cut < 0 else text[cut + len("Assistant:"):]


# Data files (Logic-RL's K&K parquet files, verl rows).
_TRUTH_LINE = re.compile(r"\b([A-Za-z]+)\b.*?\b(knight|knave)\b", re.IGNORECASE)


def parse_solution_text(text):
    """(names lowercased, knights) from a solution_text_format such as "(1) Zoey is a knight\n(2) Ethan is a
    knave", read as kk.py reads the ground truth: per non-empty line, the first ASCII word and the first
    whole-word knight/knave after it (a later line with the same name overrides it). Raises ValueError on a line
    without them or on no line."""
    if not isinstance(text, str):
        raise ValueError("solution_text_format is not a string")
    roles = {}
    for line in text.split("\n"):
        if line.strip():
            match = _TRUTH_LINE.search(line.strip())
            if match is None:
                raise ValueError(f"solution_text_format line {line.strip()[:60]!r} names no knight or knave")
            roles[match.group(1).lower()] = match.group(2).lower() == "knight"
    if not roles:
        raise ValueError("solution_text_format is empty")
    return list(roles), list(roles.values())


def parse_row(row):
    """A Logic-RL row {"quiz", "solution_text_format", ...} -> example {"puzzle", "names", "knights", "answer",
    "ask": ""} (the quiz asks its own question)."""
    names, knights = parse_solution_text(row["solution_text_format"])
    return {"puzzle": row["quiz"].strip(), "names": names, "knights": knights, "answer": row["solution_text_format"],
            "ask": ""}


def from_verl(truth, messages):
    """A verl-format row -> example {"puzzle" (last user message), "names", "knights", "answer"} from
    ground_truth["solution_text_format"]."""
    if not isinstance(truth, dict) or "solution_text_format" not in truth:
        raise ValueError("reward_model.ground_truth has no 'solution_text_format'")
    names, knights = parse_solution_text(truth["solution_text_format"])
    return {"puzzle": last_user_text(messages), "names": names, "knights": knights,
            "answer": truth["solution_text_format"], "ask": ""}


@dataclass
class KnightsKnavesTask:
    """Knights-and-Knaves task object. people: puzzle sizes (3..8); binary: 1/0 reward instead of
    Logic-RL's -3..3; rules: RULES; think_prefill: the chat prompt ends in "<think>" (official)."""

    people: tuple = (3, 4, 5)
    binary: bool = False
    rules: str = RULES[0]
    think_prefill: bool = False
    name: str = "knights_knaves"
    pass_threshold: float = 3.0
    splits: dict = field(default=None, repr=False)  # a data file's rows; None: the generator

    def __post_init__(self):
        self.pass_threshold = 1.0 if self.binary else 3.0

    @property
    def assistant_prefill(self):
        """Text the assistant's turn starts with in the chat-style prompt (rollout.render_prompts appends it after
        the generation prompt); the completion is what the model writes after it."""
        return THINK_PREFILL if self.think_prefill else ""

    def examples(self, split, n, seed):
        """`n` distinct puzzles, deterministic in (split, seed); train and test never share one. With a data file:
        up to `n` of its rows of `split`, shuffled by seed."""
        if self.splits is not None:
            return [dict(row) for row in sample_rows(self.splits, split, n, seed, "knights_knaves")]
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        rng = random.Random(f"knights_knaves-{split}-{seed}")
        out, seen = [], set()
        while len(out) < n:
            example = make_example(rng, rng.choice(self.people))
            key = example["compact"]
            in_test = zlib.crc32(key.encode()) % TEST_EVERY == 0
            if in_test == (split == "test") and key not in seen:
                seen.add(key)
                out.append(example)
        return out

    def prompt(self, example, style="chat"):
        if style == "compact":
            if "compact" not in example:
                raise ValueError("knights_knaves: a data file's puzzles have no compact code; use the chat style")
            return example["compact"]
        if style != "chat":
            raise ValueError(f"style must be 'chat' or 'compact', got {style!r}")
        if "messages" in example:  # a verl-format file's prompt, verbatim
            return [dict(message) for message in example["messages"]]
        first = example["names"][0].capitalize()
        ask = example.get("ask", "Who is a knight and who is a knave? ")
        return chat_messages(
            f"{example['puzzle']} {ask}Inside the <answer> </answer> tags, "
            f"state the identity of every inhabitant, one per line, for example <answer> (1) {first} is a "
            "knight\n(2) ... </answer>.")

    def score(self, completion, example, style="chat"):
        """(format_ok, roles_or_None) for one completion."""
        text = completion_text(completion)
        if style == "compact":
            answer = text.strip()
            if len(answer) != len(example["names"]) or set(answer) - {"0", "1"}:
                return True, None
            return True, dict(zip(example["names"], (c == "1" for c in answer)))
        if "rendered_prompt" in example:  # kk.py on the file's rendered prompt + completion
            full = example["rendered_prompt"] + text
            text = logic_rl_processed(full)
            if text is None:
                return think_answer_in_order(full), None
            if not think_answer_in_order(text):
                return False, None
        elif self.think_prefill:
            text = logic_rl_response(text)
            if not think_answer_in_order(text):
                return False, None
        elif not has_think_answer_format(text):
            return False, None
        answer = last_tag_block(text)
        if self.rules == "logic_rl":  # an empty answer is unreadable there
            return True, logic_rl_roles(answer.strip(), example["names"]) if answer.strip() else None
        return True, parse_roles(answer, example["names"])

    def reward(self, completion, example, style="chat"):
        """Logic-RL: format (+1/-1) + answer (+2 right, -1.5 wrong, -2 unreadable or bad format), the answer read
        by the task's rules; binary: 1.0 for the top score, else 0.0. Compact style has no tags: format counts as
        met, and the answer is one 0/1 digit per person."""
        format_ok, roles = self.score(completion, example, style)
        right = roles is not None and roles == dict(zip(example["names"], example["knights"]))
        if self.binary:
            return 1.0 if format_ok and right else 0.0
        answer_score = -2.0 if not format_ok or roles is None else 2.0 if right else -1.5
        return (1.0 if format_ok else -1.0) + answer_score

    def solution(self, example, style="compact"):
        if style == "compact":
            return "".join("1" if k else "0" for k in example["knights"])
        opened = self.think_prefill or example.get("rendered_prompt", "").rstrip().endswith(THINK_PREFILL)
        think = "" if opened else "<think>"  # the prompt already opened it
        return (f"{think} Checking every statement against each assignment. </think> "
                f"<answer> {example['answer']} </answer>")

    def reward_fn(self, completions, **columns):
        """TRL GRPOTrainer reward function: columns `names` and `knights`, one row per completion."""
        return rewards_from_columns(self.reward, completions, columns, ("names", "knights"))


def make_task(data=None, people=(3, 4, 5), binary=False, rules=RULES[0], think_prefill=False):
    """Factory for get_task("knights_knaves", people=(3, 4, 5) | int in 3..8, binary=False, rules="logic_rl",
    think_prefill=False, data=None | PATH)."""
    sizes = (people,) if isinstance(people, int) else tuple(people)
    if not sizes or any(not 3 <= p <= 8 for p in sizes):
        raise ValueError(f"people must be in 3..8 (an int or a tuple), got {people!r}")
    if think_prefill not in (True, False):  # a typo such as think_prefill=yes must not read as True
        raise ValueError(f"knights_knaves: think_prefill must be true or false, got {think_prefill!r}")
    rules = check_rules("knights_knaves", rules, RULES)
    splits = None if data is None else load_splits(data, ("quiz", "solution_text_format"), key="puzzle",
                                                   parse=parse_row, verl=from_verl)
    return KnightsKnavesTask(people=sizes, binary=bool(binary), rules=rules, think_prefill=bool(think_prefill),
                             splits=splits)
