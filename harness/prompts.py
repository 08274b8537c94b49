"""The training prompts of each step: fresh draws by default, or --epochs over a fixed set, with
--max-prompt-length's filter (DESIGN.md section 4, "The training prompts"). run.settle calls training_prompts once, before the run starts;
the loop asks prompts(step) for each step's examples, so a resumed run sees the batches of an uninterrupted one."""
import math
import random

from harness.checkpoint import RunError
from rollout import render_prompts


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
        lengths = [len(ids) for ids in render_prompts(tokenizer, task, examples, config.style)]
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
