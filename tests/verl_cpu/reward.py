"""verl custom reward for the end-to-end test: the task's reward (integrations.verl_data.compute_score) plus the share
of digits in the completion, so that an untrained tiny model's rewards still differ within a group."""
import os
import sys

sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository
from integrations.verl_data import compute_score as task_score  # noqa: E402


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    digits = sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)
    return task_score(data_source, solution_str, ground_truth, extra_info, **kwargs) + digits
