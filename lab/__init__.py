"""For maintainers: the lab. The results ledger and its reruns (reproduce, ledger), the referee studies (referee_*,
their page referees.md), multi-seed comparisons and their statistics (compare, summary, headline, seed_stats), a
run's clip and KL activity (runs). A learner needs none of it; the figure scripts and smollm2_cpu are in
experiments/, and nothing there imports this folder."""
