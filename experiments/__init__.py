"""Scripts that reproduce the papers' figures and tables, and the ImageNet checks (imagenet_toy, imagenet_real);
run each with python -m experiments.NAME."""
