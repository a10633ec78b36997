"""The W&B pieces that need no Slurm: the template, the agent's param file, the API key
file's permissions, the sweep id rule."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpclaunch.errors import UserError
from hpclaunch.sweeps import wandb

HPCLAUNCH = str(Path(sys.executable).parent / "hpclaunch")
# What wandb 0.31's agent writes (config_util.save_config_file_from_dict), as the double does.
PARAM_FILE = "wandb_version: 1\n\nlr:\n  value: 0.001\nopt:\n  value: adam\nwarm:\n  value: true\n"


def test_template_is_a_sweep_whose_command_is_hpclaunch_run() -> None:
    yaml = pytest.importorskip("yaml")
    out = subprocess.run([HPCLAUNCH, "sweep", "wandb-template", "python", "train.py"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    config = yaml.safe_load(out)
    assert config["program"] == "train.py"
    assert config["command"][:3] == ["hpclaunch", "run", "--"]
    assert config["command"][3:] == ["${interpreter}", "${program}", "${args}"]


@pytest.mark.parametrize("with_yaml", [True, False])
def test_param_file_with_and_without_pyyaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_yaml: bool
) -> None:
    if with_yaml:
        pytest.importorskip("yaml")
    else:
        monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml -> ImportError
    path = tmp_path / "config-abc.yaml"
    path.write_text(PARAM_FILE)
    assert wandb.params_from_file(str(path)) == {"lr": 0.001, "opt": "adam", "warm": True}
    assert wandb.params_from_file(str(tmp_path / "missing.yaml")) == {}


def test_api_key_file_must_be_private(tmp_path: Path) -> None:
    creds = tmp_path / "wandb_credentials.txt"
    creds.write_text("k" * 40 + "\n")
    creds.chmod(0o640)
    with pytest.raises(UserError, match="chmod 600"):
        wandb.api_key({}, str(creds))
    creds.chmod(0o600)
    assert wandb.api_key({}, str(creds)) == "k" * 40
    assert wandb.api_key({"WANDB_API_KEY": "env"}, str(creds)) == "env"  # environment first
    assert wandb.api_key({}, "") is None


def test_sweep_id_rule_and_the_project_file(tmp_path: Path) -> None:
    for good in ("abc123", "proj/abc123", "ent/proj/abc123"):
        assert wandb.check_sweep_id(good) == good
    for bad in ("a b", "ent/proj/id/extra", "", "ent//id"):
        with pytest.raises(UserError):
            wandb.check_sweep_id(bad)
    project = tmp_path / "hpclaunch.toml"
    project.write_text('[sweep]\nwandb_sweep = "e/p/from_file"\n')
    assert wandb.chosen_sweep(None, project) == ("e/p/from_file", "")
    chosen, warning = wandb.chosen_sweep("e/p/cli", project)
    assert chosen == "e/p/cli" and "e/p/from_file" in warning and "e/p/cli" in warning
    assert wandb.chosen_sweep("e/p/from_file", project) == ("e/p/from_file", "")
