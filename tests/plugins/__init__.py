"""User modules as a user writes them, loaded by the tests with `--plugin` or a recipe's
`plugins:` (docs/your-own-task.md includes my_reward.py as its example)."""
