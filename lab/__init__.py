"""For maintainers: the lab. The results ledger and its reruns (reproduce, ledger), the referee studies (referee_*),
multi-seed comparisons and their statistics (compare, summary, headline, seed_stats, runs). A learner needs none of
it; the figure scripts are in experiments/, and nothing there imports this folder."""
