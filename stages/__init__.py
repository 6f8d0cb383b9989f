"""FAR's stages: data_prep -> sft -> grpo -> evaluate, plus the internals they share.

Nothing here imports Prefect: every stage runs the same from a test, a notebook or a flow.
"""
