"""The run as a whole, above any single stage and below Prefect.

Loading and planning a recipe, the run manifest (run.json: every session, its outcome), and
lineage and audit across stage records. flows/ (the Prefect flow and the `far` CLI) uses it;
stages never do.
"""
