"""install.sh's parts that run without root or a VM: --help, and the Docker check it makes."""

import subprocess
from pathlib import Path

SRC = Path(__file__).resolve().parents[2]


def test_help_is_the_header_and_nothing_after_it() -> None:
    out = subprocess.run(["bash", str(SRC / "install.sh"), "--help"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0
    assert out.stdout.startswith("Installs execgate on a container host")
    assert "set -euo pipefail" not in out.stdout  # the line after the header (issue 20)
    assert out.stdout.rstrip().endswith("PIP_FIND_LINKS=/path/to/wheels ./install.sh")


def test_an_install_asks_whether_docker_is_there_before_registering() -> None:
    """The order install.sh checks in: which engines are there (else no registration), then a
    dry run of each (refused before anything changes), then configure, after the install."""
    text = (SRC / "install.sh").read_text()
    install = text[text.index("command -v python3"):]
    present = install.index("selected=$(select_engines")
    assert present < install.index('engine_ctl configure "$e" $set_default --dry-run') < \
        install.index("pip install") < \
        install.index('out=$(engine_ctl configure "$e" $set_default)')
