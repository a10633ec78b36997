"""The command line: thin commands that parse, resolve, call the core and print."""
