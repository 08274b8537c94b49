"""Scripts that reproduce the papers' figures, tables and the toy check; run each with python -m experiments.NAME."""
