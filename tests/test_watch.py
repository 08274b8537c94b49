"""harness/watch.py: a run that gets worse, stays flat or collapses says so, in words; one that learns says nothing.
Hand-made evals, with the noise margin 2 sqrt(se_0^2 + se_now^2) computed by hand."""
from harness.watch import FLAT_EVALS, Watch, noise, top_answer


def result(p, se=0.02):
    return {"pass@1": p, "pass@1_se": se}


def varied(n=20):
    return [(f"a{i}", 0.0) for i in range(n)]


def test_the_noise_margin_by_hand():
    assert abs(noise(result(0.2, 0.03), result(0.1, 0.04)) - 2 * 0.05) < 1e-12  # 2 sqrt(.03^2 + .04^2)


def test_a_learning_run_says_nothing():
    watch = Watch(tiny=True)
    assert watch.start(result(0.6), varied(), constant_pass=0.05) is None
    for step, p in enumerate((0.65, 0.72, 0.8, 0.85, 0.9), 1):
        assert watch.later_eval(step * 20, result(p), varied()) == []
    assert watch.verdict() is None


def test_a_fall_beyond_the_noise_is_said_once_with_the_train_reward_beside_it():
    watch = Watch(tiny=False)
    watch.start(result(0.205, 0.028), varied(), constant_pass=0.0)
    for r in [0.1] * 10 + [0.4] * 10:
        watch.train_row({"reward_mean": r})
    notes = watch.later_eval(20, result(0.10, 0.021), varied())  # fell 0.105 > 2 sqrt(.028^2 + .021^2) = 0.070
    assert len(notes) == 1 and "fell to 0.100 from 0.205" in notes[0] and "train reward rose 0.100 -> 0.400" \
        in notes[0] and "--lr" in notes[0]
    assert watch.later_eval(30, result(0.0, 0.0), varied()) == []  # said once
    assert "fell" in watch.verdict()


def test_a_dip_within_the_noise_is_not_a_fall():
    watch = Watch(tiny=True)
    watch.start(result(0.2, 0.028), varied())
    assert watch.later_eval(20, result(0.15, 0.025), varied()) == []  # 0.05 < 0.075


def test_flat_over_the_evals_is_said():
    watch = Watch(tiny=True)
    watch.start(result(0.105, 0.022), varied())
    notes = [watch.later_eval(step, result(0.105 + 0.01 * (step % 2), 0.022), varied()) for step in range(1, FLAT_EVALS + 1)]
    assert notes[:-1] == [[]] * (FLAT_EVALS - 1) and "flat" in notes[-1][0] and "--warm-start-target" in notes[-1][0]


def test_collapsed_answers_and_a_degenerate_start():
    samples = [("10", 0.0)] * 62 + varied(38)
    assert top_answer(samples) == ("10", 0.62)
    watch = Watch(tiny=True)
    note = watch.start(result(0.11), samples, constant_pass=0.1)
    assert "warm start ended degenerate" in note and "'10' for 62%" in note and "--warm-start-target" in note
    # a pass@1 a constant answer reaches, with varied answers
    other = Watch(tiny=False)
    assert "which answering 'a0' to every prompt reaches (0.100)" in other.start(result(0.1), varied(), 0.1)
    later = Watch(tiny=True)
    later.start(result(0.5), varied())
    assert "collapsed" in later.later_eval(20, result(0.5), samples)[0]
