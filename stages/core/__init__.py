"""What every stage stands on: storage, the stage runner and its record, sessions, drift.

Nothing here knows about models: it moves bytes (storage), decides where a stage's output
lives and when it is committed (runner), when a session must stop (sessions), which changes
between sessions are refused (drift), the dataset files stages hand each other (datasets),
and the statistics that tell a gain from noise (stats: evaluate reports them, pick decides
by them).
"""
