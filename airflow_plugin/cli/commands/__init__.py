"""One module per group of commands. Each has `register(commands, common)`, which adds its sub-commands with
their options and sets `run`: a function `(args, context) -> Output` that does the work through the engine
and returns data; rendering is render.py's."""
