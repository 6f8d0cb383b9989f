"""What FAR changes in or reads from Tunix, qwix, Orbax and JAX, declared as data (ledger.py)."""
