"""FAR's shared vocabulary: recipes (schemas.recipe), the artifacts stages hand each other
(schemas.artifacts), and stage records (schemas.record); import from those modules.

Nothing in this package does I/O or imports JAX: it is safe to import anywhere (CLI, flows,
tests, a notebook) and cheap to validate before any compute starts.
"""
