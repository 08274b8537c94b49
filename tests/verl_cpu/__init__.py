"""Test-only: verl 0.9.x's real Ray trainer on a CPU-only machine, for tests/test_verl_end_to_end.py.

verl expects CUDA GPUs and a vLLM / SGLang rollout server. These modules get past that through verl's own extension
points only (nothing in verl is edited), and are imported in every Ray process through VERL_USE_EXTERNAL_MODULES:

  cpu_platform  a "cpu" device platform (gloo, no-op device calls) and the three CPU blockers it meets
  hf_rollout    an "hf" rollout: a Ray actor running HF generate, fed the trained weights after every update
  trace         one JSON line (VERL_CPU_TRACE=<file>) each time a piece of the plug-in runs, in any process
  reward        the task's reward plus the share of digits, so an untrained model's rewards differ in a group
  launch        the plug-in's entry point, or verl's own main_ppo, with the modules above in every process
"""
