"""Shared fixtures (stubs in tests/stubs.py)."""
import pytest
import torch

import tasks
from tests.stubs import DigitsTask


@pytest.fixture
def digits_task(monkeypatch, one_thread):
    """Register DigitsTask as task "digits" (and run torch on one thread)."""
    monkeypatch.setitem(tasks.TASKS, "digits", lambda data=None: DigitsTask())


@pytest.fixture
def one_thread():
    """Tiny matmuls: one thread is fastest and does not fight other jobs for the cores (restored afterwards)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# The lesson's own tests (`python -m pytest -m lesson`): every lesson file's (softmax_grpo: advantages and theory;
# lopti, ppo, rollout, train's update), their shape, the pasted update. README.md names the command beside the full
# suite's. The docs-number linter (test_doc_numbers.py) and the lesson's sizes (test_file_sizes.py: a line a learner
# adds must not turn the lesson red) are the full suite's; a slow test of a lesson file is `-m slow`'s alone (`-m
# lesson` replaces pytest.ini's `-m "not slow"`, so a slow test marked lesson would run there).
LESSON_TESTS = ("test_advantages.py", "test_theory.py", "test_lopti.py", "test_ppo.py", "test_rollout.py",
                "test_update.py", "test_lesson_shape.py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in LESSON_TESTS and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.lesson)


def pytest_ignore_collect(collection_path, config):
    """-m lesson: the other test files are not even imported (collecting them all takes longer than the lesson's
    tests)."""
    if config.getoption("markexpr") == "lesson" and collection_path.name.startswith("test_") \
            and collection_path.suffix == ".py":
        return collection_path.name not in LESSON_TESTS
    return None
