"""`hpclaunch profile list | show NAME | init NAME`: the cluster profiles there are, one
profile's facts with their sources and what is unverified, and a new profile for any
Slurm site made by asking it (config/profilefacts.py, slurm/profileinit.py)."""

from __future__ import annotations

import json

import click

from hpclaunch.cli.common import environ


@click.group("profile")
def profile_group() -> None:
    """Cluster profiles: the built-in sites' (docs/sites.md) and your own, which override
    them key by key (~/.config/hpclaunch/clusters/NAME.toml)."""


@profile_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per profile.")
def list_cmd(as_json: bool) -> None:
    """Every profile: built-in, yours, or a built-in one your file overrides."""
    from hpclaunch.config.profilefacts import listing

    for row in listing(environ()):
        if as_json:
            click.echo(json.dumps(row, sort_keys=True))
        else:
            click.echo(f"{row['name']:<16} {row['origin']:<30} {row['description']}")


@profile_group.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the facts.")
def show_cmd(name: str, as_json: bool) -> None:
    """A profile's facts (as your own file, if any, leaves them), each with its source;
    the facts no public source confirmed are marked UNVERIFIED."""
    from hpclaunch.config.profilefacts import facts, show_text
    from hpclaunch.config.profiles import load_profile

    profile = load_profile(name, None, environ())
    rows = facts(profile)
    if as_json:
        data = {"name": profile.name, "description": profile.description, "facts": rows}
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        click.echo(show_text(profile, rows))


@profile_group.command("init")
@click.argument("name")
@click.option("--force", is_flag=True, help="Replace your profile NAME if you have one.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the file written.")
def init_cmd(name: str, force: bool, as_json: bool) -> None:
    """Write a profile for this Slurm site by asking it: scontrol show config, sinfo with
    GRES and features, scontrol show partition, scontrol show node and sacctmgr (QoS, your
    associations) where accounting answers. Nothing is asked of you; what is guessed is
    marked unverified.
    With --remote HOST it asks that cluster and writes the profile there."""
    from hpclaunch.basics.filemodes import make_dirs, write_atomic
    from hpclaunch.basics.users import user_name
    from hpclaunch.config.profiles import BUILTIN, check_name, load_profile, user_profile_dir
    from hpclaunch.errors import UserError
    from hpclaunch.slurm.profileinit import ask_site, profile_text

    env = environ()
    folder = user_profile_dir(env)
    path = folder / f"{name}.toml"
    check_name(name, "NAME")
    if name in BUILTIN:  # a user file would override it key by key, not replace it
        raise UserError("NAME", f"{name} is a built-in profile", "", "Pick another name")
    if path.exists() and not force:
        raise UserError(
            "NAME", f"{name}: {path} exists", "", "Add --force to replace it, or pick a name"
        )
    site = ask_site(user_name(env))
    text = profile_text(name, site)
    make_dirs(folder, "private")
    write_atomic(path, text)
    profile = load_profile(name, None, env)  # what was written reads back as a profile
    if as_json:
        data = {"name": name, "file": str(path), "unverified": list(profile.unverified)}
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        click.echo(f"wrote {path} ({site.cluster or 'cluster'}, Slurm {site.version})")
        if profile.unverified:
            click.echo(f"guessed, check them: {', '.join(profile.unverified)}")
        click.echo(f"use it: hpclaunch run --cluster {name} ...")
