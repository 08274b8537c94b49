"""benchmarks/decode_ops.py at a tiny shape: it runs, prints every path, and its numbers hold what the decode loop
promises: the loop's blocking syncs per decode token are 1/k (k = the stop-check interval), generate's at least one
(its stop check), and with the step counted as one graph launch the loop's host ops per token are 1 + 1/k."""
import pytest

from fast import kv_cache


@pytest.mark.skipif(not kv_cache.LAYERED_CACHE, reason="no layered cache API in this transformers")
def test_decode_ops_runs_at_a_tiny_shape_and_the_loop_syncs_once_every_k(one_thread, capsys):
    from benchmarks import decode_ops
    from fast import decode_loop as fast_loop
    every = fast_loop.STOP_CHECK_EVERY
    try:
        results = decode_ops.main(["--layers", "1", "--rows", "4", "--tokens", "4", "12", "--repeats", "1",
                                   "--stop-check-every", "4", "--bytes-rows", "4"])
    finally:
        fast_loop.STOP_CHECK_EVERY = every
    out = capsys.readouterr().out
    assert all(name in out for name in list(results)[:3])
    assert "x fewer" in out and "graph nodes" in out
    assert 20 < results["graph nodes"] < 200 and 0 < results["attention bytes"] < 1e6  # 1 layer, 4 rows
    ops, syncs, _ = results["decode loop, eager"]
    assert syncs <= 1 / 4 and ops > 10  # (12 - 4) / 4 = 2 checks over 8 tokens
    ops, syncs, _ = results["decode loop, one graph a step"]
    assert syncs == 1 / 4 and ops <= 1 + 4 / 4  # one replay + the check's ops (any, where, its read) every 4
    assert results["plain generate"][1] >= 1
    assert list(results)[:3] == ["plain generate", "decode loop, eager",
                                 "decode loop, one graph a step"]
