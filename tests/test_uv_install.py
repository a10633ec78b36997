"""scripts/uv_install.py: pip's settings on this machine become uv's, or uv is not used."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "uv_install.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("uv_install", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _listed(monkeypatch: pytest.MonkeyPatch, module: ModuleType, text: str) -> None:
    def run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        assert argv[1:] == ["-m", "pip", "config", "list"]
        return subprocess.CompletedProcess(argv, 0, stdout=text, stderr="")

    monkeypatch.setattr(module.subprocess, "run", run)


def test_pips_sources_become_uvs_and_later_scopes_win(monkeypatch: pytest.MonkeyPatch) -> None:
    uv = _module()
    _listed(monkeypatch, uv, "\n".join([
        ":env:.find-links='/opt/wheels'",
        "global.extra-index-url='file:///a/simple\\nfile:///b/simple'",  # two lines in pip.conf
        "global.index-url='https://mirror/simple'",
        ":env:.index-url='https://nearer/simple'",
        "global.constraint='/etc/c.txt'",
        "global.cert='/etc/ca.crt'",
        "download.only-binary=':all:'",  # another command's: not install's
        ":env:.disable-pip-version-check='1'",
    ]))  # fmt: skip
    env = uv.uv_environment(uv.pip_settings())
    assert env == {
        "UV_INDEX_STRATEGY": "unsafe-best-match",  # pip's: the best version of every index
        "UV_LINK_MODE": "copy",
        "UV_NO_CONFIG": "1",  # no uv.toml of its own: the same sources as pip
        "UV_FIND_LINKS": "/opt/wheels",
        "UV_EXTRA_INDEX_URL": "file:///a/simple file:///b/simple",
        "UV_INDEX_URL": "https://nearer/simple",
        "UV_CONSTRAINT": "/etc/c.txt",
        "SSL_CERT_FILE": "/etc/ca.crt",
    }


def test_a_setting_uv_cannot_take_means_pip_installs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    uv = _module()
    _listed(
        monkeypatch, uv, "global.index-url='https://mirror/simple'\nglobal.proxy='http://p:3128'\n"
    )
    assert uv.main(["-e", "."]) == 3  # nothing installed: setup.sh runs pip
    assert "pip setting 'proxy' has no uv equivalent here" in capsys.readouterr().err


def test_an_unreadable_listing_means_pip_installs(monkeypatch: pytest.MonkeyPatch) -> None:
    uv = _module()
    _listed(monkeypatch, uv, "something else entirely\n")
    with pytest.raises(uv.Untranslatable):
        uv.pip_settings()
