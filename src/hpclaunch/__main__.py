"""`python -m hpclaunch` = the `hpclaunch` command."""

from .cli.main import main

main()
