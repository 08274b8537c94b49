"""Knights and Knaves: truth tables, uniqueness by brute force, the answer parser and Logic-RL scoring."""

import itertools
import re

import pytest
from hypothesis import given, settings, strategies as st

from tasks import COMPACT_ALPHABET, get_task
from tasks.knights_knaves import decode_compact, logic_rl_roles, parse_roles
from tasks.knights_knaves_logic import knight_tables, solutions, truth_table

# Hand-solved puzzle: Alice says "Bob is a knave"; Bob says "Alice and I are knights".
# Alice knight -> Bob knave -> Bob's claim is false, as a knave's must be: consistent.
# Alice knave -> Bob knight -> Bob's claim must be true, but Alice is a knave: contradiction.
HAND = {"names": ["alice", "bob"], "knights": [True, False]}
HAND_STATEMENTS = [("is", 1, False), ("and", ("is", 0, True), ("is", 1, True))]


def chat(answer):
    return f"<think> case analysis </think> <answer> {answer} </answer>"


@pytest.fixture(scope="module")
def task():
    return get_task("knights_knaves")


@pytest.fixture(scope="module")
def puzzles(task):
    return task.examples("train", 300, seed=0)


def brute_force(statements):
    """Reference solver written the slow, obvious way (tuples of bools, recursive evaluation)."""
    def holds(s, roles):
        kind = s[0]
        if kind == "is":
            return roles[s[1]] == s[2]
        if kind == "not":
            return not holds(s[1], roles)
        a, b = holds(s[1], roles), holds(s[2], roles)
        return {"and": a and b, "or": a or b, "imp": (not a) or b, "iff": a == b}[kind]
    n = len(statements)
    return [list(r) for r in itertools.product([False, True], repeat=n)
            if all(r[i] == holds(s, r) for i, s in enumerate(statements))]


def test_knight_tables_two_people():
    # assignments a = 0..3, bit i of a = person i is a knight
    assert knight_tables(2) == [0b1010, 0b1100]
    knights, full = knight_tables(2), 0b1111
    assert truth_table(("and", ("is", 0, True), ("is", 1, False)), knights, full) == 0b0010  # only a = 1
    assert truth_table(("imp", ("is", 0, True), ("is", 1, True)), knights, full) == 0b1101
    assert truth_table(("iff", ("is", 0, True), ("is", 1, True)), knights, full) == 0b1001
    assert truth_table(("not", ("is", 1, False)), knights, full) == 0b1100


def test_hand_puzzle_has_the_hand_solution():
    assert solutions(HAND_STATEMENTS) == brute_force(HAND_STATEMENTS) == [[True, False]]


def test_solutions_counts_ambiguous_and_paradoxical_puzzles():
    # each vouches for the other: both knights or both knaves
    assert sorted(solutions([("is", 1, True), ("is", 0, True)])) == [[False, False], [True, True]]
    # "I am a knave" has no consistent assignment at all
    assert solutions([("is", 0, False), ("is", 0, True)]) == []


def test_every_generated_puzzle_has_exactly_one_solution(task, puzzles):
    for example in puzzles:
        statements = decode_compact(example["compact"])
        assert brute_force(statements) == [example["knights"]]
        assert len({s if s[0] not in ("and", "or", "iff") else (s[0],) + tuple(sorted(s[1:]))
                     for s in statements}) == len(statements)  # no repeated statement
        for i, s in enumerate(statements):  # nobody says (anything equivalent to) "I am a knave"
            assert s not in (("is", i, False), ("not", ("is", i, True)))
        assert task.reward(chat(example["answer"]), example) == 3.0
        assert task.reward(task.solution(example, "chat"), example) == 3.0
        assert task.reward(task.solution(example, "compact"), example, style="compact") == 3.0


def test_puzzle_text_names_everyone_and_sizes_follow_option(puzzles):
    for example in puzzles[:50]:
        assert 3 <= len(example["names"]) <= 5
        for name in example["names"]:
            assert name.capitalize() in example["puzzle"]
    big = get_task("knights_knaves", people=8).examples("train", 3, seed=0)
    assert all(len(e["names"]) == 8 and len(solutions(decode_compact(e["compact"]))) == 1 for e in big)


def test_compact_prompt_and_solution_use_the_alphabet(task, puzzles):
    for example in puzzles:
        text = task.prompt(example, "compact") + task.solution(example, "compact")
        assert set(text) <= set(COMPACT_ALPHABET)


def test_parser_any_order_case_insensitive():
    names = HAND["names"]
    assert parse_roles("(1) Alice is a knight\n(2) Bob is a knave", names) == {"alice": True, "bob": False}
    assert parse_roles("BOB is a KNAVE, and alice is a knight.", names) == {"alice": True, "bob": False}
    assert parse_roles("Alice is not a knave; Bob: knave", names) == {"alice": True, "bob": False}


@pytest.mark.parametrize("answer", [
    "(1) Alice is a knight",                                  # one role for two people
    "(1) Alice is a knight\n(2) Bob is a knave\n(3) Bob is a knight",  # three roles
    "Alice and Bob are knights",                              # one role word
    "(1) Alice is a knight\n(2) Alice is a knave",            # Bob missing, Alice doubled
    "knight knave",                                           # roles with no names
])
def test_parser_rejects_wrong_number_or_missing_names(answer):
    assert parse_roles(answer, HAND["names"]) is None


def test_logic_rl_scores(task):
    right = "(1) Alice is a knight\n(2) Bob is a knave"
    wrong = "(1) Alice is a knave\n(2) Bob is a knave"
    assert task.reward(chat(right), HAND) == 3.0           # +1 format, +2 answer
    assert task.reward(chat(wrong), HAND) == -0.5          # +1 format, -1.5 answer
    assert task.reward(chat("no idea"), HAND) == -1.0      # +1 format, -2 unparseable
    assert task.reward(f"<answer> {right} </answer>", HAND) == -3.0       # -1 format, -2 (not graded)
    assert task.reward(chat(right) + " <answer> x </answer>", HAND) == -3.0  # two answer blocks
    # a completion that starts inside a pre-filled <think> still has the format
    assert task.reward(f"case analysis </think> <answer> {right} </answer>", HAND) == 3.0


# The examples: Zoey is a knight, Oliver a knave. Scores are format (+1 / -1) + answer (+2 right,
# -1.5 read but wrong, -2 unreadable), computed by hand for the Logic-RL reader and for ours.
ZOEY = {"names": ["zoey", "oliver"], "knights": [True, False]}


@pytest.mark.parametrize("answer, logic_rl, lenient", [
    ("(1) Zoey is a knight\n(2) Oliver is a knave", 3.0, 3.0),
    ("Oliver is a knave, Zoey is a knight", 3.0, 3.0),          # any order
    ("ZOEY IS A KNIGHT; oliver   is\na knave", 3.0, 3.0),        # any case, any whitespace
    ("Zoey: knight, Oliver: knave", -1.0, 3.0),                  # no "is a": unreadable officially
    ("Zoey is not a knave, Oliver is a knave", -1.0, 3.0),       # "is not a" is not "is a"
    ("Zoey is an knight, Oliver is a knave", -1.0, 3.0),
    ("Zoey is a knights, Oliver is a knave", -1.0, 3.0),         # "knights" counts as a role word, not as a role
    ("(1) Zoey is a knave\n(2) Oliver is a knave", -0.5, -0.5),  # read, wrong
    ("Zoey is a knight, Oliver is a knave, and knights never lie", -1.0, -1.0),  # 3 role words for 2 people
    ("Zoey is a knight", -1.0, -1.0),                            # 1 role word for 2 people
    ("Zoey is a knight, Zoe is a knave", -1.0, -1.0),            # Oliver never named
    ("", -1.0, -1.0),
])
def test_logic_rl_and_lenient_truth_table(answer, logic_rl, lenient):
    completion = chat(answer)
    assert get_task("knights_knaves").reward(completion, ZOEY) == logic_rl
    assert get_task("knights_knaves", rules="logic_rl").reward(completion, ZOEY) == logic_rl
    assert get_task("knights_knaves", rules="lenient").reward(completion, ZOEY) == lenient


@pytest.mark.parametrize("completion", [
    "<answer> (1) Zoey is a knight\n(2) Oliver is a knave </answer>",                    # no think block
    "<think> a </think> <think> b </think> <answer> Zoey is a knight, Oliver is a knave </answer>",
    "<answer> Zoey is a knight, Oliver is a knave </answer> <think> a </think>",          # wrong order
    "<think> a </think> <answer> Zoey is a knight </answer> <answer> Oliver is a knave </answer>",
    "<think> a <answer> Zoey is a knight, Oliver is a knave </answer> </think>",          # answer inside think
])
def test_logic_rl_format_failures_score_minus_three(completion):
    for rules in ("logic_rl", "lenient"):
        assert get_task("knights_knaves", rules=rules).reward(completion, ZOEY) == -3.0


def test_logic_rl_reader_details():
    # whole words: "bella" is not found inside "Isabella", and the first "<name> is a ..." decides
    names = ["isabella", "bella"]
    assert logic_rl_roles("Isabella is a knight, Bella is a knave", names) == {"isabella": True, "bella": False}
    assert logic_rl_roles("Isabella is a knight, Isabella is a knave", names) is None
    assert logic_rl_roles("Bella is a knave. Isabella is a knight", names) == {"isabella": True, "bella": False}
    assert logic_rl_roles("Bella is a knave or Bella is a knight", ["bella", "tara"]) is None  # Tara missing
    # a completion that starts inside a pre-filled <think> has the format, as with the official prompt
    prefilled = "case analysis </think> <answer> Zoey is a knight, Oliver is a knave </answer>"
    assert get_task("knights_knaves").reward(prefilled, ZOEY) == 3.0
    assert get_task("knights_knaves", binary=True).reward(chat("Zoey: knight, Oliver: knave"), ZOEY) == 0.0
    assert get_task("knights_knaves", binary=True).reward(chat("Zoey is a knight, Oliver is a knave"), ZOEY) == 1.0


def logic_rl_reference(text, names, knights):
    """The Logic-RL / AR-Lopti scorer transcribed plainly (regexes, str.find), on a response whose prompt
    pre-filled "<think>" when the response has none, for the fuzz test below."""
    if "<think>" not in text and text.count("</think>") == 1:
        text = "<think>" + text
    tags = ["<think>", "</think>", "<answer>", "</answer>"]
    positions = [text.find(tag) for tag in tags]
    if any(text.count(tag) != 1 for tag in tags) or positions != sorted(positions):
        return -3.0
    answer = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)[-1].strip()
    if not answer or answer.lower().count("knight") + answer.lower().count("knave") != len(names):
        return -1.0
    roles = {}
    for name in names:
        found = re.search(rf"\b{name}\b\s+is\s+a\s+\b(knight|knave)\b", answer, re.IGNORECASE)
        if not found:
            return -1.0
        roles[name] = found.group(1).lower()
    return 3.0 if roles == {n: "knight" if k else "knave" for n, k in zip(names, knights)} else -0.5


KK_TAGS = ["<think>", "</think>", "<answer>", "</answer>"] + [" x "] * 16
KK_PIECES = ["Zoey: knight", "Zoey is an knight", "Zoey is not a knave", "Olivers is a knave", "Oliver is a knaves",
             "knights lie", "x"] + ["Zoey is a knight", "zoey  is\na knave", "Oliver is a knave",
                                    "OLIVER is\ta knight"] * 3


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(KK_TAGS), max_size=2), st.lists(st.sampled_from(KK_PIECES), min_size=1, max_size=3),
       st.lists(st.sampled_from(KK_TAGS), max_size=2))
def test_logic_rl_rules_match_a_plain_transcription(before, answer, after):
    text = "".join(before) + "<think> x </think> <answer>" + ", ".join(answer) + "</answer>" + "".join(after)
    assert get_task("knights_knaves").reward(text, ZOEY) == logic_rl_reference(text, ZOEY["names"], ZOEY["knights"])


def test_compact_style_ignores_the_rules():
    for rules in ("logic_rl", "lenient"):
        task = get_task("knights_knaves", rules=rules)
        assert [task.reward(c, HAND, style="compact") for c in ("10", "01", "1", "1x")] == [3.0, -0.5, -1.0, -1.0]


def test_binary_variant_and_pass_threshold():
    binary = get_task("knights_knaves", binary=True)
    assert binary.pass_threshold == 1.0
    assert binary.reward(chat("(1) Alice is a knight\n(2) Bob is a knave"), HAND) == 1.0
    assert binary.reward(chat("(1) Alice is a knave\n(2) Bob is a knave"), HAND) == 0.0
    assert binary.reward("(1) Alice is a knight\n(2) Bob is a knave", HAND) == 0.0  # no tags
    assert get_task("knights_knaves").pass_threshold == 3.0  # accuracy (train.py's pass@1) = share at the top score


def test_compact_answers(task):
    assert task.reward("10", HAND, style="compact") == 3.0
    assert task.reward("01", HAND, style="compact") == -0.5
    assert task.reward("1", HAND, style="compact") == -1.0
    assert task.reward("1x", HAND, style="compact") == -1.0


@pytest.mark.parametrize("hostile", ["__import__('os').system('echo pwned')", "knight " * 20_000,
                                     "(" * 10_000, "x" * 100_000, "١٠", "alice " * 200_000 + "knight knave"])
def test_hostile_answers_are_unparseable(task, hostile):
    for rules_task in (task, get_task("knights_knaves", rules="lenient")):
        assert rules_task.reward(chat(hostile), HAND) == -1.0
        assert rules_task.reward(hostile, HAND) == -3.0
        assert rules_task.reward(hostile, HAND, style="compact") == -1.0


def test_a_megabyte_answer_is_read_in_one_pass():
    spaced = chat("Alice is a knight" + " " * 1_000_000 + "Bob is a knave")
    assert get_task("knights_knaves").reward(spaced, HAND) == 3.0  # Logic-RL reads any length
    assert get_task("knights_knaves", rules="lenient").reward(spaced, HAND) == -1.0  # ours: over 2000 characters


def test_examples_deterministic_and_splits_disjoint(task, puzzles):
    assert task.examples("train", 300, seed=0) == puzzles
    assert task.examples("train", 20, seed=1) != puzzles[:20]
    test = {e["compact"] for e in task.examples("test", 200, seed=0)}
    assert not test & {e["compact"] for e in puzzles}


def test_bad_options_raise():
    with pytest.raises(ValueError, match="people"):
        get_task("knights_knaves", people=9)
    with pytest.raises(ValueError, match="data"):
        get_task("knights_knaves", data="x.jsonl")


# --- think_prefill: the official prompt ends in "<think>", and the official scorer checks prompt + response ---------
# Expected values are the AR-Lopti kk.py compute_score of the decoded sequence (ChatML prompt ending in
# "<|im_start|>assistant\n<think>", then the completion), recorded by hand; `ours` is the default rule's score.
RIGHT = "(1) Zoey is a knight\n(2) Oliver is a knave"


@pytest.mark.parametrize("completion, official, ours", [
    (f"<think> a </think> <answer> {RIGHT} </answer>", -3.0, 3.0),                 # repeats the prefilled <think>
    (f"<think></think><answer>{RIGHT}</answer>", -3.0, 3.0),
    (f" I will close the <think> block later. </think> <answer> {RIGHT} </answer>", -3.0, 3.0),  # <think> in reasoning
    (f" Assistant: let me check each case </think> <answer> {RIGHT} </answer>", -3.0, 3.0),  # cut after Assistant:
    (f" a </think> <answer> {RIGHT} </answer> Assistant: done", -3.0, 3.0),
    # the same where both agree
    (f" a </think> <answer> {RIGHT} </answer>", 3.0, 3.0),
    (" a </think>\n<answer>\n(1) ZOEY is a knight\n(2) oliver is\ta knave\n</answer>", 3.0, 3.0),
    (" a </think> <answer> (1) Zoey is a knave\n(2) Oliver is a knave </answer>", -0.5, -0.5),
    (" a </think> <answer> Zoey: knight, Oliver: knave </answer>", -1.0, -1.0),
    (" a </think> <answer> </answer>", -1.0, -1.0),
    (f" User asked. Assistant: <think> x </think> <answer> {RIGHT} </answer>", 3.0, 3.0),  # a new <think> after it
    (f" a <|im_start|>assistant </think> <answer> {RIGHT} </answer>", 3.0, 3.0),  # the prompt's header is first
    (f"<answer> {RIGHT} </answer>", -3.0, -3.0),
    (f" a </think> <answer> {RIGHT} </answer> <answer> x </answer>", -3.0, -3.0),
    (f" is <answer> the tag? </think> <answer> {RIGHT} </answer>", -3.0, -3.0),
])
def test_think_prefill_scores_as_the_official_scorer(completion, official, ours):
    assert get_task("knights_knaves", think_prefill=True).reward(completion, ZOEY) == official
    assert get_task("knights_knaves").reward(completion, ZOEY) == ours  # the default rule, unchanged
    binary = get_task("knights_knaves", think_prefill=True, binary=True)
    assert binary.reward(completion, ZOEY) == (1.0 if official == 3.0 else 0.0)


def test_think_prefill_lenient_rules_read_the_answer_after_the_official_format_check():
    lenient = get_task("knights_knaves", think_prefill=True, rules="lenient")
    assert lenient.reward(" a </think> <answer> Zoey: knight, Oliver: knave </answer>", ZOEY) == 3.0
    assert lenient.reward(" a </think> <answer> Zoey: knight, Oliver: knave </answer> Assistant:", ZOEY) == -3.0


def test_think_prefill_option_prefill_solution_and_errors(puzzles):
    on, off = get_task("knights_knaves", think_prefill=True), get_task("knights_knaves")
    assert (on.think_prefill, on.assistant_prefill, off.think_prefill, off.assistant_prefill) == (True, "<think>",
                                                                                                  False, "")
    for example in puzzles[:20]:
        assert not on.solution(example, "chat").startswith("<think>")  # the prompt opened it
        assert on.reward(on.solution(example, "chat"), example) == 3.0
        assert on.reward(on.solution(example, "compact"), example, style="compact") == 3.0
        assert on.prompt(example, "chat") == off.prompt(example, "chat")  # the prefill is not a message
    for bad in ("yes", "true", 2):
        with pytest.raises(ValueError, match="^knights_knaves: think_prefill must be true or false"):
            get_task("knights_knaves", think_prefill=bad)


def test_render_prompts_ends_the_chat_prompt_with_think_when_on(puzzles):
    import string

    from rollout import render_prompts
    from harness.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer(string.printable)
    tokenizer.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}<assistant>{% endif %}")
    on, off = get_task("knights_knaves", think_prefill=True), get_task("knights_knaves")
    examples = puzzles[:3]

    def texts(task):
        return [tokenizer.decode(ids, skip_special_tokens=True) for ids in render_prompts(tokenizer, task, examples,
                                                                                        "chat")]

    for with_prefill, without in zip(texts(on), texts(off)):
        assert without.endswith("<assistant>") and with_prefill == without + "<think>"
    assert render_prompts(tokenizer, on, examples, "compact") == render_prompts(tokenizer, off, examples, "compact")


# ---------------------------------------------------------------------------------------------------------
# Data files: Logic-RL's K&K parquet rows (quiz, names, solution, solution_text_format, ... and verl columns).
import json  # noqa: E402

from tasks.knights_knaves import parse_solution_text  # noqa: E402

QUIZ = ('A very special island is inhabited only by knights and knaves. You meet 2 inhabitants: Zoey and Ethan. '
        'Zoey said, "Ethan is a knave." Ethan said, "Zoey is a knight." So who is a knight and who is a knave?')
TRUTH = "(1) Zoey is a knight\n(2) Ethan is a knave"
RENDERED_KK = (f"<|im_start|>system\nAnswer in tags.\n<|im_end|>\n<|im_start|>user\n{QUIZ}\n<|im_end|>\n"
               "<|im_start|>assistant\n<think>")


def logic_rl_row(i, quiz=QUIZ, truth=TRUTH, verl=True):
    row = {"quiz": quiz, "names": ["Zoey", "Ethan"], "knight_knave": {"knight": "knight", "knave": "knave"},
           "solution": [True, False], "solution_text": "Zoey is a knight, and Ethan is a knave.",
           "solution_text_format": truth, "statements": "(('lying', 1), ('telling-truth', 0))", "index": i}
    if verl:
        row.update(data_source="kk_logic", prompt=[{"content": RENDERED_KK.replace("2 inhabitants", f"{i} x"),
                                                    "role": "user"}],
                   ability="logic", reward_model={"ground_truth": {"solution_text_format": truth,
                                                                   "statements": row["statements"]}, "style": "rule"},
                   extra_info={"index": i, "split": "train"})
    return row


def test_solution_text_format_is_read_as_kk_py_reads_it():
    assert parse_solution_text(TRUTH) == (["zoey", "ethan"], [True, False])
    assert parse_solution_text("(1) Zoey is a KNAVE\n\n  (2) Ethan is a knight  ") == (["zoey", "ethan"], [False, True])
    with pytest.raises(ValueError, match="names no knight or knave"):
        parse_solution_text("(1) Zoey is a knight\n(2) ???")


def test_logic_rl_parquet_prompt_is_verbatim_and_scored_as_kk_py(tmp_path):
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    folder = tmp_path / "merge_34ppl"
    folder.mkdir()
    pandas.DataFrame([logic_rl_row(i) for i in range(6)]).to_parquet(folder / "train.parquet")
    pandas.DataFrame([logic_rl_row(i) for i in range(6, 8)]).to_parquet(folder / "test.parquet")
    task = get_task("knights_knaves", data=str(folder))
    assert len(task.splits["train"]) == 6 and len(task.splits["test"]) == 2
    example = task.examples("test", 1, 0)[0]
    content = example["messages"][0]["content"]
    assert task.prompt(example) == [{"role": "user", "content": content}] and content.endswith("<think>")
    assert example["names"] == ["zoey", "ethan"] and example["knights"] == [True, False]
    right = " reasoning </think> <answer> (1) Zoey is a knight\n(2) Ethan is a knave </answer>"
    assert task.reward(right, example) == 3.0
    assert task.reward(right.replace("knave", "knight"), example) == -0.5  # format +1, wrong answer -1.5
    assert task.reward("<think>" + right, example) == -3.0  # the rendered prompt already opened <think>
    assert task.reward(" x </think> <answer> Zoey: knight </answer>", example) == -1.0
    assert task.reward(task.solution(example, "chat"), example) == 3.0
    with pytest.raises(ValueError, match="no compact code"):
        task.prompt(example, "compact")


def test_quiz_rows_without_verl_columns_get_our_instruction(tmp_path):
    path = tmp_path / "kk.jsonl"
    path.write_text("".join(json.dumps(logic_rl_row(i, quiz=f"{QUIZ} ({i})", verl=False)) + "\n" for i in range(30)))
    task = get_task("knights_knaves", data=str(path), think_prefill=True)
    example = (task.splits["train"] + task.splits["test"])[0]
    user = task.prompt(example)[-1]["content"]
    assert user.startswith(example["puzzle"] + " Inside the <answer> </answer> tags") and user.count("who is a knave") == 1
    assert task.reward(" x </think> <answer> (1) Zoey is a knight\n(2) Ethan is a knave </answer>", example) == 3.0
    generated = get_task("knights_knaves").examples("train", 1, 0)[0]
    assert " Who is a knight and who is a knave? Inside" in get_task("knights_knaves").prompt(generated)[-1]["content"]


def test_malformed_kk_rows_name_file_and_row(tmp_path):
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    path = tmp_path / "train.parquet"
    pandas.DataFrame([logic_rl_row(0), logic_rl_row(1, truth="(1) nobody here")]).to_parquet(path)
    with pytest.raises(ValueError, match=rf"^{path}: row 2: solution_text_format line .* names no knight or knave$"):
        get_task("knights_knaves", data=str(path))
    jsonl = tmp_path / "kk.jsonl"
    jsonl.write_text(json.dumps(logic_rl_row(0, verl=False)) + "\n" + json.dumps({"quiz": QUIZ}) + "\n")
    with pytest.raises(ValueError, match=rf"^{jsonl}:2: field 'solution_text_format' missing or not a string$"):
        get_task("knights_knaves", data=str(jsonl))
