"""FAR's maintained benchmarks: each backs a claim in the docs and is run by a test or by the
command that doc gives, as `python -m bench.NAME` from the repository root (so `stages`,
`schemas`, `pipeline` and `tests.conftest` import from this tree). Not installed with FAR and
outside its import contract; one-off investigations live in experiments/."""
