"""Prefect orchestration of FAR's stages, and the `far` CLI. No training logic lives here."""
