"""The Countdown solver: one expression over all the given integers (each used once, + - * /, exact division only)
that equals the target, or None. Used by the generator (tasks/countdown.py keeps a problem only when it is
solvable) and for the tiny model's supervised warm start (the task's `solution`)."""
from functools import lru_cache

# values[mask] = every integer reachable from the numbers in bitmask `mask` (exact division only). The target is
# checked, and the expression rebuilt, by a depth-first search over splits of a mask into two parts that looks the
# needed right operand up in the other part's set instead of looping.
_ATOM, _PRODUCT, _SUM = 3, 2, 1


def _value_sets(numbers):
    """{mask: set of reachable integers} for every non-empty proper subset of the numbers."""
    k = len(numbers)
    full = (1 << k) - 1
    values = {1 << i: {n} for i, n in enumerate(numbers)}
    for mask in sorted(range(1, full), key=lambda m: bin(m).count("1")):
        if mask in values:
            continue
        reachable = set()
        sub = (mask - 1) & mask
        while sub:
            rest = mask ^ sub
            if sub < rest:  # unordered split; both operand orders are added below
                for a in values[sub]:
                    for b in values[rest]:
                        reachable.update((a + b, a - b, b - a, a * b))
                        if b and a % b == 0:
                            reachable.add(a // b)
                        if a and b % a == 0:
                            reachable.add(b // a)
            sub = (sub - 1) & mask
        values[mask] = reachable
    return values


def _split(mask, value, values):
    """(left_mask, a, op, b) with a op b == value, a from values[left_mask], b from the rest; or None."""
    sub = (mask - 1) & mask
    while sub:
        rest_values = values[mask ^ sub]
        for a in values[sub]:
            needed = {"+": value - a, "-": a - value}
            if a and value % a == 0:
                needed["*"] = value // a
            if value and a % value == 0 and a // value:
                needed["/"] = a // value
            for op, b in needed.items():
                if b in rest_values:
                    return sub, a, op, b
            if value == 0 and a == 0 and rest_values:  # 0 * b and 0 / b (b != 0)
                b = next((x for x in rest_values if x), None)
                if b is not None:
                    return sub, a, "/", b
        sub = (sub - 1) & mask
    return None


def _expression(mask, value, values, numbers):
    """(text, precedence) of an expression over the numbers in `mask` equal to `value` (which is reachable)."""
    if mask & (mask - 1) == 0:
        return str(numbers[mask.bit_length() - 1]), _ATOM
    sub, a, op, b = _split(mask, value, values)
    ta, pa = _expression(sub, a, values, numbers)
    tb, pb = _expression(mask ^ sub, b, values, numbers)
    left = f"({ta})" if (op in "*/" and pa == _SUM) else ta
    right_needs = pb == _SUM if op in "-*" else pb <= _PRODUCT if op == "/" else False
    right = f"({tb})" if right_needs else tb
    return f"{left}{op}{right}", _SUM if op in "+-" else _PRODUCT


@lru_cache(maxsize=65536)
def solve(numbers, target):
    """One expression (compact, minimal parentheses) using every number of the tuple `numbers` exactly once
    that equals `target` with integer intermediate results, or None when there is none."""
    if len(numbers) == 1:
        return str(numbers[0]) if numbers[0] == target else None
    full = (1 << len(numbers)) - 1
    values = _value_sets(numbers)
    if _split(full, target, values) is None:
        return None
    return _expression(full, target, values, numbers)[0]
