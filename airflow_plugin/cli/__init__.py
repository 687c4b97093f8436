"""The `savepoints` command line: the engine for people on call, no Airflow needed (pip's layout).

main.py        parse, resolve the context once, run, render, exit code
parser.py      the main parser (global options, --version) and the sub-commands
options.py     the global options, the options only some commands take, the job argument JOB
commands/      one module per group of commands: snapshots, jobs, retention
render.py      JSON or text and tables; progress bars
exit_codes.py  the one mapping from errors to exit codes
"""

from .main import main

__all__ = ["main"]
