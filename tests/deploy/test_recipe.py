"""The deployment recipe (docs/deployment.md) is the tested one: its nginx and systemd blocks are the
files under deploy/, and the unit's command line is one ``voicewire serve`` accepts."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from voicewire.realtime.cli import _ice_servers, build_parser
from voicewire.realtime.config import IceServer

pytestmark = pytest.mark.shared_cores  # the recipe's files: nothing timed

REPO = Path(__file__).resolve().parents[2]
RECIPE = (REPO / "docs" / "deployment.md").read_text()


@pytest.mark.parametrize(
    ("fence", "path"), [("nginx", "deploy/nginx.conf"), ("ini", "deploy/voicewire.service")]
)
def test_the_recipe_shows_the_deploy_files_as_they_are(fence: str, path: str) -> None:
    blocks = re.findall(rf"```{fence}\n(.*?)```", RECIPE, re.S)
    assert (REPO / path).read_text() in blocks, f"docs/deployment.md's {fence} block is not {path}: copy it again"


def test_the_systemd_unit_starts_serve_with_flags_it_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    unit = (REPO / "deploy" / "voicewire.service").read_text().replace("\\\n", " ")
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    argv = shlex.split(exec_start.removeprefix("ExecStart="))
    assert argv[0].endswith("/voicewire") and argv[1] == "serve"
    args = build_parser().parse_args(argv[1:])
    assert (args.base_path, args.trusted_proxy, args.host) == ("/voice", ["127.0.0.1"], "127.0.0.1")
    # The TURN credential comes from the unit's EnvironmentFile, as the unit's comment says.
    monkeypatch.setenv("VOICEWIRE_ICE_CREDENTIAL", "from-the-environment-file")
    servers = _ice_servers(args)
    assert servers[-1] == IceServer(
        ("turn:turn.example.com:3478?transport=udp",),
        username="voicewire",
        credential="from-the-environment-file",
    )
