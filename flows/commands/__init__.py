"""One module per `far` command: each registers its parser (`add_command(commands)`) and
handles its parsed arguments (`cmd_<name>(args) -> exit code`). Shared options and exit codes
are in `options`, what the console shows in `console`; flows/cli.py assembles the parser."""
