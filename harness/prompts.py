"""The training prompts of each step: fresh draws by default, or --epochs over a fixed set, with
--max-prompt-length's filter (DESIGN.md section 4, "The training prompts"). settle calls training_prompts once,
before the run starts; the loop asks prompts(step) for each step's examples, so a resumed run sees the batches of an
uninterrupted one. within_context checks them (and the held-out prompts) against the loaded model."""
import contextlib
import math
import random
import signal
import threading
import traceback

from harness.config import InputError
from harness.files import RunError
from rollout import render_prompts

RENDER_SECONDS = 2.0  # + 10 ms a prompt, for one batch: a chat template renders a prompt in about a millisecond


def epoch_steps(config, batches_per_epoch):
    """The RL steps of --epochs: epochs x batches per epoch, or a --steps given, if fewer (verl stops at whichever
    comes first)."""
    return min(config.epochs * batches_per_epoch, config.steps if "steps" in config.given else math.inf)


def training_prompts(task, tokenizer, config):
    """-> (prompts(step): the step's prompts_per_step training examples, the run's steps). By default fresh draws
    seeded by (seed, step), for config.steps steps. With --epochs: a fixed set (train_size rows, or the whole data
    file), reshuffled each epoch, cut into len(set) // prompts_per_step batches per epoch (the last partial batch
    dropped, as verl does), for epoch_steps steps. --max-prompt-length leaves out examples whose rendered prompt is
    longer (the set once; fresh draws are topped up from further draws of the same step)."""
    size = config.prompts_per_step

    def fits(examples):
        if config.max_prompt_length is None:
            return examples
        lengths = rendered_lengths(tokenizer, task, examples, config, "the training prompts (--max-prompt-length)")
        return [ex for ex, n in zip(examples, lengths) if n <= config.max_prompt_length]

    if not config.epochs:
        def fresh(step):
            examples, draw = [], 0
            while len(examples) < size:
                if draw == 20:
                    raise RunError(f"--max-prompt-length {config.max_prompt_length}: 20 draws of {size} prompts "
                                   f"gave only {len(examples)} short enough; raise it")
                seed = config.seed * 1_000_003 + step + 7_919 * draw  # draw 0: the seed of a run without the filter
                examples += fits(task.examples("train", size, seed=seed))
                draw += 1
            return examples[:size]
        return fresh, config.steps
    pool = fits(task.examples("train", config.train_size, seed=config.seed))
    per_epoch = len(pool) // size
    if per_epoch == 0:
        raise RunError(f"--epochs: the training set has {len(pool)} usable prompts, fewer than --prompts-per-step "
                       f"{size}")

    def epoch_batch(step):
        epoch, batch = divmod(step - 1, per_epoch)
        order = random.Random(f"{config.seed}-epoch-{epoch}").sample(range(len(pool)), len(pool))
        return [pool[i] for i in order[batch * size:(batch + 1) * size]]
    return epoch_batch, epoch_steps(config, per_epoch)


def within_context(prompts, eval_examples, model, tokenizer, task, config):
    """prompts(step), each batch checked as it is drawn (the held-out one now): each prompt must
    leave --max-new-tokens positions of the model's context, else one InputError naming it."""
    context = getattr(model.config, "max_position_embeddings", None)

    def check(examples, where):
        lengths = rendered_lengths(tokenizer, task, examples, config, where)
        for number, length in enumerate(lengths, start=1):
            if context and length + config.max_new_tokens > context:
                room = context - config.max_new_tokens
                raise InputError(f"{where}: prompt {number} is {length} tokens; with --max-new-tokens "
                                 f"{config.max_new_tokens} it needs {length + config.max_new_tokens} positions, and "
                                 f"{config.model}'s context is {context}: "
                                 + (f"shorter prompts (--max-prompt-length {room} leaves such training prompts out) "
                                    "or a lower --max-new-tokens" if room > 0 else "lower --max-new-tokens"))

    check(eval_examples, "the held-out prompts")

    def checked(step):
        examples = prompts(step)
        check(examples, f"the training prompts of step {step}")
        return examples
    return checked


def rendered_lengths(tokenizer, task, examples, config, where):
    """The token lengths of the examples' prompts, rendered under a time limit (a looping chat
    template is stopped); a template that fails is one line naming its folder: an InputError for
    --model's, a RunError for a resumed checkpoint's."""
    source, fault = (config.resume, RunError) if config.resume else (config.model, InputError)
    seconds = RENDER_SECONDS + 0.01 * len(examples)
    try:
        with time_limit(seconds, f"rendering {where} took over {seconds:.1f} s: the chat template of {source} loops "
                                 "or is far too slow; fix or replace its chat_template", fault):
            return [len(ids) for ids in render_prompts(tokenizer, task, examples, config.style)]
    except (InputError, RunError):
        raise
    except Exception as error:
        if not template_fault(error):
            raise
        cause = (str(error).strip().splitlines() or [""])[0][:200]
        raise fault(f"rendering {where}: the chat template of {source} failed ({type(error).__name__}: {cause}); "
                    "fix or replace its chat_template") from None


def template_fault(error):
    """Whether an error is the chat template's: jinja's own (TemplateError: a syntax error, the sandbox's
    SecurityError, raise_exception) or one raised while running the template's code (a frame of "<template>")."""
    import jinja2
    return isinstance(error, jinja2.TemplateError) or any(
        frame.f_code.co_filename == "<template>" for frame, _ in traceback.walk_tb(error.__traceback__))


@contextlib.contextmanager
def time_limit(seconds, message, error=InputError):
    """error(message) (an InputError unless given) if the block runs longer than `seconds` (SIGALRM: in the main
    thread only; elsewhere the block runs unlimited)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum, frame):
        raise error(message)
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
