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
