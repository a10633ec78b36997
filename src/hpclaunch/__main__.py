"""`python -m hpclaunch` = the `hpclaunch` command."""

from hpclaunch.cli.main import main

main()
