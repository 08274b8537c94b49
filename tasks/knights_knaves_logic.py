"""The logic of Knights and Knaves puzzles (DESIGN.md §6): statements, their truth tables over all 2^n knight/knave
assignments (one Python integer each, bit a set when the statement holds under assignment a; person i is a knight
in assignment a iff bit i of a is set), the consistent assignments, and the generator of puzzles with exactly one
solution. Rendering the statements as text and scoring answers: tasks/knights_knaves.py."""

OPS = ("leaf", "not", "and", "or", "imp", "iff")  # drawn uniformly for the top of each statement


# Statements are tuples: ("is", person, is_knight) | ("not", leaf) | (op, leaf, leaf) for op in and/or/imp/iff.
def knight_tables(n):
    """knight_tables(n)[i]: truth table (int with 2^n bits) of "person i is a knight"."""
    return [sum(1 << a for a in range(1 << n) if a >> i & 1) for i in range(n)]


def truth_table(statement, knights, full):
    """Truth table of a statement given the leaf tables `knights` and the all-ones mask `full`."""
    kind = statement[0]
    if kind == "is":
        return knights[statement[1]] if statement[2] else full ^ knights[statement[1]]
    if kind == "not":
        return full ^ truth_table(statement[1], knights, full)
    a, b = truth_table(statement[1], knights, full), truth_table(statement[2], knights, full)
    if kind == "and":
        return a & b
    if kind == "or":
        return a | b
    if kind == "imp":
        return (full ^ a) | b
    return full ^ (a ^ b)  # iff


def solutions(statements):
    """All assignments (as lists of bools, True = knight) consistent with the statements, by brute force."""
    n = len(statements)
    knights, full = knight_tables(n), (1 << (1 << n)) - 1
    consistent = full
    for i, statement in enumerate(statements):
        consistent &= full ^ (knights[i] ^ truth_table(statement, knights, full))
    return [[bool(a >> i & 1) for i in range(n)] for a in range(1 << n) if consistent >> a & 1]


def _random_statement(rng, speaker, n, knights, full):
    """One statement for `speaker`, never equivalent to "I am a knave" (nobody can say that)."""
    while True:
        kind = rng.choice(OPS)
        if kind in ("leaf", "not"):
            leaf = ("is", rng.randrange(n), rng.random() < 0.5)
            statement = leaf if kind == "leaf" else ("not", leaf)
        else:
            first, second = rng.sample(range(n), 2)  # two different people: no "A or not A"
            statement = (kind, ("is", first, rng.random() < 0.5), ("is", second, rng.random() < 0.5))
        if truth_table(statement, knights, full) != full ^ knights[speaker]:
            return statement


def _canonical(statement):
    """The statement with the operands of and / or / iff sorted, so "A and B" repeats "B and A"."""
    if statement[0] in ("and", "or", "iff"):
        return (statement[0],) + tuple(sorted(statement[1:]))
    return statement


def generate_statements(rng, n):
    """Statements of a puzzle with n people that has exactly one solution and no repeated statement."""
    knights, full = knight_tables(n), (1 << (1 << n)) - 1
    while True:
        statements = [_random_statement(rng, i, n, knights, full) for i in range(n)]
        if len(set(map(_canonical, statements))) == n and len(solutions(statements)) == 1:
            return statements
