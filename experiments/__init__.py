"""One-off investigations: each asked one question once (experiments/README.md has the
question, the answer and the date). Run as `python -m experiments.NAME` from the repository
root; not installed with FAR, outside its import contract, not kept current with the code."""
