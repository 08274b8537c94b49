"""`python -m tests.verl_cpu.launch [--main-ppo] <hydra overrides>`: a verl training run on a CPU, test-only.

Without --main-ppo: the plug-in's own entry point (integrations.verl_plugin.main: Lopti, the ar loss, the
estimators). With it: verl's own `main_ppo`, the plug-in loaded as an external module only. Either way the harness
modules (tests/verl_cpu) are in VERL_USE_EXTERNAL_MODULES before verl is imported, so every process loads them:
the driver here, and the Ray workers through the runtime environment (the plug-in's prepare_config adds itself to
what is set; for main_ppo the overrides below set it).
"""
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HARNESS = ["tests.verl_cpu.cpu_platform", "tests.verl_cpu.hf_rollout", "tests.verl_cpu.trace"]
PLUGIN = "integrations.verl_plugin"


def main():
    main_ppo = "--main-ppo" in sys.argv
    sys.argv = [arg for arg in sys.argv if arg != "--main-ppo"]
    modules = HARNESS + ([PLUGIN] if main_ppo else [])
    os.environ["VERL_USE_EXTERNAL_MODULES"] = ",".join(modules)  # the driver's own `import verl` loads them
    paths = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    os.environ["PYTHONPATH"] = os.pathsep.join([REPO, *paths])
    env = "++ray_kwargs.ray_init.runtime_env.env_vars"
    sys.argv += [f"{env}.VERL_ENGINE_DEVICE=cuda", f"{env}.VERL_CPU_TRACE={os.environ.get('VERL_CPU_TRACE', '')}"]
    import verl  # noqa: F401  (loads the harness here, before anything asks for the platform)
    if main_ppo:  # nobody adds the modules for verl's own launcher: the workers' environment names them
        sys.argv += [f'{env}.VERL_USE_EXTERNAL_MODULES="{",".join(modules)}"', f'{env}.PYTHONPATH="{REPO}"']
        from verl.trainer import main_ppo as verl_main_ppo
        return verl_main_ppo.main()
    from integrations import verl_plugin
    return verl_plugin.main()


if __name__ == "__main__":
    sys.exit(main())
