"""`hpclaunch` entry point: where the command runs, and the one-line error contract.

Every user error, including click's own usage errors, prints
`hpclaunch: error: <field>: <problem> (<limit>). <fix>` and exits 2; no tracebacks.
A command for a remote cluster (--remote HOST, or a profile's [remote] host) is
forwarded before click or any command module is imported, so SSH adds little to it;
heavy modules are imported inside the commands so that `hpclaunch run` starts fast.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

from hpclaunch.errors import USER_ERROR_EXIT, HpclaunchError, Interrupted, UserError


def __getattr__(name: str) -> Any:
    """`cli`, the click group, for callers that import it from here (lazily)."""
    if name == "cli":
        from hpclaunch.cli.group import cli

        return cli
    raise AttributeError(name)


def _interrupt_on_signals() -> None:
    """SIGTERM/SIGHUP become an exception, so that packing, staging and starting clean up
    after themselves and record how the run ended (the default would just die)."""
    import signal

    def handler(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def _dispatch(argv: Optional[list[str]]) -> object:
    """Here, or on the cluster a --remote or the profile's [remote] names."""
    from pathlib import Path

    from hpclaunch.basics.environ import environment
    from hpclaunch.remote.choose import choose

    words = list(sys.argv[1:] if argv is None else argv)
    choice = choose(words, Path.cwd(), environment())
    if choice is None:
        _refuse_laptop_options(words)
        return _run_here(argv)
    if _is_dev_server(choice.argv):  # a relay over ssh's stdio, not a forwarded command
        from hpclaunch.sessions.laptop import remote_session

        return remote_session(choice.host, choice.argv, Path.cwd(), environment())
    from hpclaunch.remote.forward import forward

    return forward(choice.host, choice.argv, Path.cwd(), environment())


def _is_dev_server(argv: tuple[str, ...]) -> bool:
    """`dev --jupyter` or `dev --vscode` (a shell is a terminal, forwarded like attach)."""
    words = argv[: argv.index("--")] if "--" in argv else argv
    return bool(words) and words[0] == "dev" and bool({"--jupyter", "--vscode"} & set(words))


def _refuse_laptop_options(words: list[str]) -> None:
    """--ship and --forward-env say what a laptop sends a cluster: only with --remote."""
    for word in words[: words.index("--")] if "--" in words else words:
        name = word.partition("=")[0]
        if name in ("--ship", "--forward-env"):
            raise UserError(
                name,
                "only with --remote HOST (or a profile's [remote] host)",
                "",
                "Add --remote HOST, or leave it out: here the program sees this environment",
            )


def _run_here(argv: Optional[list[str]]) -> object:
    """The click group; its usage errors in one line, its Abort as the interrupt it was."""
    import click

    from hpclaunch.basics.environ import environment
    from hpclaunch.cli.group import _usage_line, cli
    from hpclaunch.observe import logs

    logs.configure(no_color=bool(environment().get("NO_COLOR")))
    try:
        return cli.main(args=argv, prog_name="hpclaunch", standalone_mode=False)
    except click.UsageError as exc:
        print(f"hpclaunch: error: {_usage_line(exc)}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
    except click.exceptions.Abort as exc:
        # click turns KeyboardInterrupt (and so SIGTERM/SIGHUP, see above) into Abort.
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, Interrupted):
            raise cause from None
        raise KeyboardInterrupt from None


def main(argv: Optional[list[str]] = None) -> None:
    _interrupt_on_signals()
    try:
        code = _dispatch(argv)
    except HpclaunchError as exc:
        print(exc.line(), file=sys.stderr)
        sys.exit(exc.exit_code)
    except Interrupted as exc:
        print(f"hpclaunch: interrupted (signal {exc.signum})", file=sys.stderr)
        sys.exit(128 + exc.signum)
    except KeyboardInterrupt:
        print("hpclaunch: interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main()
