"""Math answers checked by Hugging Face's math-verify, as the official SoftmaxGRPO reward checks
GSM8K and DeepMath (DESIGN.md §6): the gold answer in \\boxed{} parsed with LaTeX extraction, the
final text with LaTeX and expression extraction, math_verify.verify. math-verify is optional: a task
whose rules need it checks for it when created.

sympy can hang on a short text (9**9**9**9) and math-verify's signal.alarm timeouts work only in the
main thread and cannot stop C-level integer work, so they are off and these bounds take their place:
at most MAX_MATH_CHARS of the final text (from its last \\boxed{} on, else its end); a number of
more than MAX_DIGITS digits scores 0 unparsed unless the gold is one too (too_large, bounded from
the literals); and the check runs in one helper process (this file as a script) with DEADLINE_S per
answer, killed past it. Works from any thread (a lock) and after a fork.
"""

import atexit
import importlib.util
import json
import math
import os
import re
import select
import subprocess
import sys
import threading
import time

MAX_MATH_CHARS = 1000  # characters of the final text that are parsed
MAX_DIGITS = 100_000  # a larger number is not an answer to a benchmark problem, and sympy may take minutes on it
DEADLINE_S = 5.0  # wall-clock seconds per answer (the official code's parse and verify timeouts are 5 s each)
STARTUP_S = 120.0  # seconds for the helper to import math-verify and warm up
_lock = threading.Lock()
_helper = {}  # {"process": Popen, "pid": the process that started it}


def require_math_verify(task):
    """One-line error at task creation when math-verify is not installed."""
    if importlib.util.find_spec("math_verify") is None:
        raise ValueError(f"{task}: rules='math_verify' needs the math-verify package (pip install math-verify, or "
                         f"pip install -r requirements-dev.txt)")


def math_answer_is_right(gold, final):
    """True when math-verify finds the answer in `final` (a completion's final text) equal to `gold` (a plain or
    LaTeX answer such as "42" or "\\frac{\\pi}{2}"), within the bounds above."""
    box = final.rfind("\\boxed")
    final = final[box:box + MAX_MATH_CHARS] if 0 <= box < len(final) - MAX_MATH_CHARS else final[-MAX_MATH_CHARS:]
    if too_large(final) and not too_large(gold):
        return False
    request = json.dumps([gold, final]).encode("ascii") + b"\n"  # ensure_ascii: one line, whatever the text
    with _lock:
        process = _running_helper()
        try:
            process.stdin.write(request)
            process.stdin.flush()
            reply = _read_line(process.stdout.fileno(), DEADLINE_S)
        except OSError:  # the helper died (killed, out of memory)
            reply = None
        if reply not in (b"0", b"1"):  # late, dead, or out of step: start afresh
            _stop_helper()
            return False
        return reply == b"1"


# Numbers too large to write: a bound on log10 |value| from the literals alone, before sympy sees the text
_NUMBER = re.compile(r"\d+(?:\.\d*)?")
_SKIP = re.compile(r"\s+|\\[,;!: ]|\\left|\\right")


class _Bound:
    """A recursive-descent reader of a numeric expression (digits, + - * / ^ ** !, \\cdot \\times, { } ( ),
    \\sqrt, \\frac, \\binom) that returns an upper bound on log10(|value| + 1), or raises ValueError on anything
    else. Exponents are bounded before they are used, so 10^{10^{10}} costs three steps, not a number."""

    def __init__(self, text):
        self.text, self.at = text, 0

    def peek(self, *tokens):
        while True:
            match = _SKIP.match(self.text, self.at)
            if not match or not match.group():
                break
            self.at = match.end()
        return next((t for t in tokens if self.text.startswith(t, self.at)), None)

    def take(self, *tokens):
        token = self.peek(*tokens)
        if token is None:
            raise ValueError(f"expected one of {tokens}")
        self.at += len(token)
        return token

    def sum(self):
        bound = self.product()
        while self.peek("+", "-"):
            self.take("+", "-")
            bound = max(bound, self.product()) + 0.302  # |a + b| <= 2 max(|a|, |b|)
        return bound

    def product(self):
        bound = self.power()
        while self.peek("*", "\\cdot", "\\times", "/"):
            if self.take("**", "*", "\\cdot", "\\times", "/") == "**":
                raise ValueError("** after a product")
            bound += self.power()  # a quotient is bounded as a product: only large values matter here
        return bound

    def power(self):
        base = self.atom()
        if self.peek("!"):
            self.take("!")
            base = 10 ** min(base, 300) * base  # n! <= n^n
        if self.peek("**", "^"):
            self.take("**", "^")
            exponent = self.power()  # right-associative: 9^9^9 = 9^(9^9)
            return base * 10 ** min(exponent, 300)  # log10(a^b) = b log10 a <= 10^log10(b) log10(a)
        return base

    def atom(self):
        if self.peek("-", "+"):
            self.take("-", "+")
        if self.peek("{", "("):
            close = "}" if self.take("{", "(") == "{" else ")"
            bound = self.sum()
            self.take(close)
            return bound
        if self.peek("\\sqrt"):
            self.take("\\sqrt")
            return self.atom() / 2
        if self.peek("\\frac", "\\dfrac", "\\tfrac"):
            self.take("\\frac", "\\dfrac", "\\tfrac")
            numerator = self.atom()
            self.atom()
            return numerator
        if self.peek("\\binom", "\\dbinom", "\\tbinom"):
            self.take("\\binom", "\\dbinom", "\\tbinom")
            top = self.atom()
            self.atom()
            return 10 ** min(top, 300) * 0.302  # C(n, k) <= 2^n
        match = _NUMBER.match(self.text, self.at)
        if not match:
            raise ValueError("no number")
        self.at = match.end()
        digits = match.group().split(".")[0].lstrip("0")
        return len(digits) if len(digits) > 15 else math.log10(float(match.group()) + 1)


def log10_bound(expression):
    """An upper bound on log10(|value| + 1) of a numeric expression, or None when it is not one we can bound."""
    reader = _Bound(expression)
    try:
        bound = reader.sum()
        return bound if reader.peek() is None and reader.at >= len(expression.rstrip()) else None
    except (ValueError, RecursionError, OverflowError):
        return None


_GROUP = r"(?:\{(?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\}){1,80}\}|\((?:[^()]){1,80}\))"  # {..} (3 deep) or (..)
_EXPONENT = rf"(?:{_GROUP}|\d+(?:\s*(?:\^|\*\*)\s*(?:\d+|{_GROUP})){{0,20}})"
_POWER = re.compile(rf"(?P<base>\d+(?:\.\d+)?|[}})])\s*(?:\^|\*\*)\s*(?P<exponent>{_EXPONENT})")
_FACTORIAL = re.compile(rf"(?P<n>\d+|{_GROUP})\s*!")
_BINOMIAL = re.compile(rf"\\[dt]?binom\s*(?P<top>\d+|{_GROUP})\s*(?P<bottom>\d+|{_GROUP})")


def too_large(text):
    """True when `text` writes a number with more than MAX_DIGITS digits: a power, factorial or binomial whose
    operands (at most a few dozen characters each, read by log10_bound) make it that large. Linear in the text."""
    for match in _POWER.finditer(text):
        exponent = log10_bound(match.group("exponent"))
        base = match.group("base")
        if exponent is None or (base[0].isdigit() and float(base) <= 1):  # 1^n = 1
            continue
        base_digits = math.log10(float(base)) if base[0].isdigit() else 0.1  # (..)^n, \sqrt{2}^n: a base >= 1.26
        if base_digits * 10 ** min(exponent, 300) > MAX_DIGITS:
            return True
    for match in _FACTORIAL.finditer(text):
        n = log10_bound(match.group("n"))
        if n is not None and 10 ** min(n, 300) * n > MAX_DIGITS:  # log10(n!) <= n log10(n)
            return True
    for match in _BINOMIAL.finditer(text):
        top, bottom = log10_bound(match.group("top")), log10_bound(match.group("bottom"))
        if top is not None and bottom is not None and 10 ** min(bottom, 300) * top > MAX_DIGITS:  # C(n, k) <= n^k
            return True
    return False


def helper_process():
    """The math-verify helper process now running (None if none): benchmarks/task_generation.py watches it."""
    return _helper.get("process")


def _running_helper():
    if _helper.get("pid") == os.getpid() and _helper["process"].poll() is None:
        return _helper["process"]
    _stop_helper()  # ours if it died; a forked parent's is left alone
    process = subprocess.Popen([sys.executable, "-u", os.path.abspath(__file__), str(os.getpid())],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    if _read_line(process.stdout.fileno(), STARTUP_S) != b"ready":
        process.kill()
        process.wait()
        raise RuntimeError("the math-verify helper process did not start (its error is printed above)")
    _helper.update(process=process, pid=os.getpid())
    return process


def _read_line(fd, seconds):
    """One line (without its newline) from file descriptor `fd` within `seconds`, or None (timeout, end of file)."""
    data = b""
    deadline = time.monotonic() + seconds
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        data += chunk
    return data[:-1]


@atexit.register
def _stop_helper():
    process, pid = _helper.pop("process", None), _helper.pop("pid", None)
    if process is not None and pid == os.getpid():
        process.kill()
        process.wait()


def _die_with_parent(parent_pid):
    """The helper's life is tied to its parent's: on Linux the kernel kills it when the parent dies (even mid-way
    through a long sympy computation); elsewhere it ends at the next answer, when stdin closes."""
    try:
        import ctypes
        import signal
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: no prctl
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(0)


def _serve():
    """The helper: read [gold, final] JSON lines from stdin, answer "1" or "0" lines on stdout."""
    import logging
    from functools import lru_cache

    out = os.fdopen(os.dup(1), "wb", buffering=0)  # the answers' own channel ...
    os.dup2(2, 1)  # ... so that anything a library prints goes to stderr, not into the answers
    sys.stdout = sys.stderr
    logging.disable(logging.WARNING)  # math-verify warns that its timeouts are off: the parent's deadline rules
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    @lru_cache(maxsize=4096)
    def gold_parse(gold):  # the M completions of a prompt share one gold answer
        return parse("\\boxed{" + gold + "}", extraction_config=[LatexExtractionConfig()], parsing_timeout=None)

    def right(gold, final):
        expected = gold_parse(gold)
        answer = parse(final, extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
                       parsing_timeout=None)
        return bool(expected and answer and verify(expected, answer, timeout_seconds=None))

    right("1", "1")  # warm up: the first parse loads the LaTeX grammar
    out.write(b"ready\n")
    for line in sys.stdin.buffer:
        try:
            ok = right(*json.loads(line))
        except Exception:  # whatever sympy raises on odd input: not a right answer
            ok = False
        out.write(b"1\n" if ok else b"0\n")


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)  # this folder: the task files' names must not shadow the modules math-verify imports
    _die_with_parent(int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid())
    _serve()
