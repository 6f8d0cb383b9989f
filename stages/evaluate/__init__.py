"""The evaluate stage kind: generate on a dataset split for each model, score, report.

evaluation.py holds the stage (generation, scoring, the entry point `run`); stats.py the
statistics that tell a gain from noise (Wilson intervals, exact McNemar, the paired sign-flip
test of sampled solve rates); headroom.py pass@k and the solve-rate histogram; reports.py the
report files and tables; fewshot.py the base model's worked examples; progress.py the batches
a session keeps. Importers name the module they use; this package re-exports nothing.
"""
