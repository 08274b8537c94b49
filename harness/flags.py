"""Reading a Config: the command line generated from its fields, a resumed run's saved settings merged in, and the
optional libraries its settings need checked, all before torch loads.

    config = load(sys.argv[1:])     # parse_args, then --resume's run.json (resumed), then check_libraries

Errors are one line: exit code 2 for a flag (InputError, fail), 1 for the run's files (RunError). What each setting
is, its default and its paper value: harness/config.py.
"""
import argparse
import dataclasses
import importlib.util
import json
import os
import sys

import tasks
from harness.checkpoint import RESUME_NOTES, checkpoint_step, load_run_settings, refuse_live_run, resolve_checkpoint
from harness.config import ADDED_SETTINGS, RETIRED_SETTINGS, Config, InputError, field_choices, field_kind, flag_name, resumable
from harness.files import RunError


PIP_NAMES = {"torchao": "torchao", "peft": "peft", "tensorboard": "tensorboard", "wandb": "wandb",
             "math_verify": "math-verify", "gguf": "gguf", "accelerate": "accelerate"}  # module -> pip package


def require_library(module, needed_by):
    """InputError "<needed_by> needs <module>: pip install <package>" when `module` is not installed (find_spec:
    nothing is imported)."""
    if importlib.util.find_spec(module) is None:
        raise InputError(f"{needed_by} needs {module}: pip install {PIP_NAMES[module]}")


def check_libraries(config):
    """Every optional library config's settings need, checked before any model loads (flags.load for the command
    line, settle for a Config from Python): an InputError naming the pip command of the first one missing;
    then W&B's API key when it runs online (check_wandb_login). A .gguf model or --model smollm2 is checked
    by model.model_source, which load and the tokenizer call."""
    reporters = (config.report_to or "").split(",")
    rules = (config.task_options.get("rules", tasks.RULES[config.task][0]) if config.task in tasks.RULES else None)
    gguf_reference = config.resume and config.kl_coef > 0 and not config.lora_rank and (
        config.initial_policy == "smollm2" or str(config.initial_policy).endswith(".gguf"))
    for needed, module, needed_by in [
            (config.optimizer == "adamw8bit", "torchao", "--optimizer adamw8bit"),
            (config.base_dtype == "nf4", "torchao", "--base-dtype nf4"),
            (config.lora_rank > 0, "peft", "--lora-rank"),
            ("tensorboard" in reporters, "tensorboard", "--report-to tensorboard"),
            ("wandb" in reporters, "wandb", "--report-to wandb"),
            (rules == "math_verify", "math_verify", f"--task {config.task} (its reward rules 'math_verify')"),
            (gguf_reference, "gguf", f"--kl-coef's reference policy {config.initial_policy}"),
            (gguf_reference, "accelerate", f"--kl-coef's reference policy {config.initial_policy}")]:
        if needed:
            require_library(module, needed_by)
    if "wandb" in reporters:
        check_wandb_login(config)


def parse_task_option(text):
    """"KEY=VALUE" -> (key, value): the value parsed as JSON when it parses ("3" -> 3), else kept as text."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--task-option must look like KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


FLOAT32_MAX = 3.4028234663852886e38  # a float setting reaches float32 tensors (the seconds of --reward-timeout do not)


def number_type(kind, name=""):
    """int/float parser with a plain message (and no nan or inf, nor a float beyond float32's range)."""
    largest = sys.float_info.max if name == "reward_timeout" else FLOAT32_MAX  # any finite number of seconds

    def parse(text):  # argparse prefixes the message with "argument --flag: "
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a{'n integer' if kind is int else ' number'}, "
                                             f"got {text!r}") from None
        if kind is float and not abs(value) <= largest:  # nan and inf too
            bound = " within float32's range (+-3.4e38)" if largest == FLOAT32_MAX else ""
            raise argparse.ArgumentTypeError(f"expected a finite number{bound}, got {text!r}")
        return value
    return parse


def build_parser(prog="train.py"):
    """An argparse parser with one flag per Config field; every default is SUPPRESS, so the parsed namespace holds
    exactly the flags given (what a resumed run checks and the tiny model's defaults leave alone)."""
    parser = argparse.ArgumentParser(prog=prog, description="RL fine-tuning with SoftmaxGRPO, AR and Lopti "
                                     "(train.py). Every flag is a field of config.Config.",
                                     usage="%(prog)s [--flag value ...]", argument_default=argparse.SUPPRESS)
    for f in dataclasses.fields(Config):
        meta = f.metadata
        if not meta.get("flag", True):
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        shown = "none" if default is None else json.dumps(default) if isinstance(default, dict) else \
            "off" if default is False else default
        help_text = f"{meta['help']} (default: {shown}" + (f"; paper: {meta['paper']})" if meta["paper"] is not None
                                                            else ")")
        names = [flag_name(f.name)] + ([meta["alias"]] if meta.get("alias") else [])
        choices, (kind, _) = field_choices(f), field_kind(f)
        if kind is bool:  # every switch is off by default: the flag turns it on
            parser.add_argument(*names, dest=f.name, action="store_true", help=help_text)
        elif kind is dict:
            parser.add_argument(*names, dest=f.name, action="append", metavar="KEY=VALUE", help=help_text)
        else:
            parser.add_argument(*names, dest=f.name, choices=choices, help=help_text.replace("%", "%%"),
                                type=number_type(kind, f.name) if kind in (int, float) else str,
                                metavar=None if choices else {int: "N", float: "X"}.get(kind, "TEXT"))
    return parser


PATH_SETTINGS = ("output_dir", "warm_start_cache")  # folders a run writes to as it goes


def fixed_paths(config, keys=PATH_SETTINGS):
    """config with the folders `keys` names made absolute, once, where the run starts: a task that
    changes the working directory (os.chdir in a reward) then moves none of the run's files."""
    changes = {key: os.path.abspath(getattr(config, key)) for key in keys
               if getattr(config, key) is not None and getattr(config, key) != os.path.abspath(getattr(config, key))}
    return dataclasses.replace(config, **changes) if changes else config


def fail(message, prog="train.py"):
    """One line on stderr and exit code 2: no usage dump, no traceback."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args(argv=None, prog="train.py"):
    """The command line -> a validated Config whose `given` names the flags that were given. Errors: one line."""
    parser = build_parser(prog)
    parser.error = lambda message: fail(message, prog)
    given = vars(parser.parse_args(argv))
    try:
        if "task_options" in given:
            given["task_options"] = dict(map(parse_task_option, given["task_options"]))
        config = Config(**given, given=frozenset(given))
        return fixed_paths(config.validate())
    except ValueError as error:
        fail(str(error), prog)


def load(argv=None, prog="train.py"):
    """The command line -> the run's Config: parse_args, then for --resume the saved run's settings (resumed). Reads
    run.json only, so it needs no torch. Errors are one line: exit code 2 for a flag, 1 for the run's files."""
    config = parse_args(argv, prog)
    try:
        if config.task.endswith(".py"):  # a task file: by its absolute path, in run.json too
            config = dataclasses.replace(config, task=tasks.custom.source_file(config.task))
        if config.resume:
            config = resumed(config)
        if not config.dry_run:  # before torch: a missing library answers at once
            check_libraries(config)
        if config.resume:
            return config
        if config.model != "tiny" and not config.dry_run:
            from harness.model import model_source  # torch-free: a missing path or unreachable hub id fails here
            model_source(config.model)
        return config
    except RunError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        sys.exit(1)
    except ValueError as error:
        fail(str(error), prog)


def saved_config(checkpoint_dir):
    """A checkpoint's run.json -> its settings as a validated Config: the one reader of run.json (train.py's
    --resume, merge_lora, the experiments). An older run.json's missing ADDED_SETTINGS take their defaults (off);
    any other missing or unknown key, or a value that fails validate(), is a RunError naming the file."""
    saved, path = load_run_settings(checkpoint_dir), os.path.join(checkpoint_dir, "run.json")
    keys = {f.name for f in dataclasses.fields(Config) if f.metadata.get("saved", True)}
    defaults = {f.name: f.default for f in dataclasses.fields(Config) if f.name in ADDED_SETTINGS}
    saved = {**{key: defaults[key] for key in ADDED_SETTINGS if key not in saved}, **saved}  # an older run.json
    saved = {key: value for key, value in saved.items() if key not in RETIRED_SETTINGS}
    if set(saved) != keys:
        raise RunError(f"{path}: not this train.py's settings (missing {sorted(keys - set(saved))}, unknown "
                       f"{sorted(set(saved) - keys)}); resume from another checkpoint")
    try:
        return Config(**saved).validate()
    except (TypeError, ValueError) as error:
        raise RunError(f"{path}: {error}; resume from another checkpoint") from None


def named_task(saved, config, path):
    """The task a resumed run may import: a built-in one as saved; a task file or module only when this command
    line names it with --task (a run folder someone handed over never chooses code to run). -> the task."""
    if saved.task in tasks.TASKS:
        return saved.task
    if "task" not in config.given:
        raise RunError(f"{path}: this run's task is your own code ({saved.task}); a resume imports only code its "
                       f"command line names: add --task {saved.task} (or where that file is now)")
    if config.task in tasks.TASKS:
        raise RunError(f"--task {config.task} conflicts with the run being resumed, whose task is your own code "
                       f"({saved.task}); name that file or module")
    return config.task  # its sha256 is checked against the saved one when the task is built (settle.task_file)


def resumed(config, log=print):
    """The saved run's settings with the flags given now merged in: a resumable() flag takes the new
    value, any other must equal the saved one (else a RunError). A task file is imported only when
    --task names it again."""
    if not config.dry_run:  # a live run prunes its checkpoints as it saves: nothing read from it would hold
        refuse_live_run(config.resume)
    if not os.path.exists(config.resume):
        raise ValueError(f"--resume {config.resume}: no such folder")
    RESUME_NOTES.clear()  # which checkpoint it takes: said once that checkpoint passes its checks (a dry run: now)
    checkpoint_dir = resolve_checkpoint(config.resume, log if config.dry_run else RESUME_NOTES.append)
    saved, path = saved_config(checkpoint_dir), os.path.join(checkpoint_dir, "run.json")
    run_dir, name = os.path.dirname(checkpoint_dir), os.path.basename(checkpoint_dir)
    step = checkpoint_step(run_dir, name)
    if step is None:
        raise RunError(f"--resume {config.resume}: a checkpoint folder must be named checkpoint-<step> inside its run "
                       f"folder, got {name!r}")
    checkpoint_dir = os.path.join(run_dir, f"checkpoint-{step}")  # recover() renames a .tmp into place
    if "output_dir" in config.given and os.path.realpath(config.output_dir) != run_dir:
        raise RunError(f"--output-dir {config.output_dir} conflicts with the run being resumed, which lives in "
                       f"{run_dir}; drop the flag")
    normal = lambda value: json.loads(json.dumps(value))  # noqa: E731  (tuples -> lists, as saved)
    changes = {"task": named_task(saved, config, path)}
    for key in sorted(config.given - {"resume", "dry_run", "output_dir", "overwrite"}):
        value = {**saved.task_options, **config.task_options} if key == "task_options" else getattr(config, key)
        if key in resumable():
            changes[key] = value
        elif key == "task" and saved.task not in tasks.TASKS:
            continue  # named_task
        elif normal(value) != normal(getattr(saved, key)):
            raise RunError(f"{flag_name(key)} {getattr(config, key)} conflicts with the run being resumed "
                           f"({getattr(saved, key)!r}); drop the flag, or start a new run with another --output-dir")
    def merged(**changed):
        return dataclasses.replace(saved, **changed, resume=checkpoint_dir, output_dir=run_dir,
                                   dry_run=config.dry_run, given=config.given).validate()

    def fails(**changed):
        try:
            return merged(**changed) and False
        except (TypeError, ValueError):
            return True
    try:
        return merged(**changes)
    except (TypeError, ValueError) as error:  # saved passed validate() alone: a flag given now is the cause
        culprits = [flag_name(key) for key in sorted(changes) if key in config.given and fails(**{key: changes[key]})]
        raise RunError(f"{' '.join(culprits) or 'the flags given'} {'with' if culprits else 'conflict with'} the "
                       f"run being resumed ({path}): {error}; drop or change the flag") from None


def check_wandb_login(config):
    """--report-to wandb online needs an API key where W&B looks for one, looked up as wandb.init
    does but without its prompt (which would ask at a terminal, or fail after the model loaded):
    none is an InputError naming the ways out."""
    import wandb
    try:  # W&B's own lookup (wandb 0.31); a W&B without it: wandb.init decides, as before
        from wandb.sdk import wandb_setup
        from wandb.sdk.lib import wbauth
    except ImportError:
        return
    try:
        settings = wandb_setup.singleton().settings  # what wandb.init reads: loaded once per process, no service
        if settings.mode in ("offline", "dryrun", "disabled"):
            return
        host = wbauth.HostUrl(settings.base_url)
        found = wbauth.authenticate_session(host=host, source="train.py", prompt=False, update_session=False)
    except wandb.errors.Error as error:  # a key of the wrong form (WANDB_API_KEY, the netrc entry), a bad setting
        raise InputError(wandb_failed(error, config.output_dir)) from None
    if found is None:
        raise InputError(wandb_failed(f"no API key for {host.url}", config.output_dir))


def wandb_failed(error, output_dir):
    """One line for a W&B run that cannot start (no API key, no network): error, a W&B error or its text."""
    cause = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return (f"--report-to wandb: W&B could not start a run ({cause}); log in with `wandb login` (or set "
            f"WANDB_API_KEY), or set WANDB_MODE=offline to write the run into {os.path.join(output_dir, 'wandb')} "
            "(`wandb sync` uploads it later)")
