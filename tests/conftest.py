"""Shared fixtures (stubs in tests/stubs.py)."""
import pytest
import torch

import tasks
from tests.stubs import DigitsTask


@pytest.fixture
def digits_task(monkeypatch):
    """Register DigitsTask as task "digits" and run torch on one thread (tiny matrices; robust on a shared CPU)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setitem(tasks.TASKS, "digits", lambda data=None: DigitsTask())
    yield
    torch.set_num_threads(threads)
