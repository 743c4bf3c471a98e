"""`execgatectl configure|unconfigure ENGINE`: register execgate with a container engine in the
engine's own format and place, and take it out again exactly (the shape of
`nvidia-ctk runtime configure`).

    configure   docker|containerd|crio|podman [--set-as-default] [--dry-run] [--config PATH]
                [--runtime-name NAME] [--runtime-path PATH]
    unconfigure docker|containerd|crio|podman [--dry-run] [--config PATH] [...]
    present     ENGINE [--config PATH]   (python3 -m only: exit 0 when this host has it)

Idempotent; invalid input is refused (exit 3) before anything is written; it says how to make
the engine read the change. One module per engine says what its files hold
(configure_docker, _containerd, _crio, _podman), configure_files how they change. Stdlib only:
install.sh runs it as `python3 -m execgate.ctl.configure` before the package is installed.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from types import ModuleType

from . import configure_containerd, configure_crio, configure_docker, configure_podman
from .configure_files import InvalidConfig, Options, Plan, apply

ENGINES: dict[str, ModuleType] = {
    "docker": configure_docker,
    "containerd": configure_containerd,
    "crio": configure_crio,
    "podman": configure_podman,
}
EXIT_INVALID = 3
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def add_arguments(p: argparse.ArgumentParser, undo: bool) -> None:
    p.add_argument("engine", choices=sorted(ENGINES))
    if not undo:
        p.add_argument("--set-as-default", action="store_true",
                       help="make execgate the engine's default runtime (unconfigure undoes it)")
    p.add_argument("--dry-run", action="store_true", help="show the change, write nothing")
    p.add_argument("--config", dest="engine_config", metavar="PATH",
                   help="the engine file (docker: daemon.json; containerd: config.toml; crio, "
                   "podman: the drop-in); default the engine's own place")
    p.add_argument("--runtime-name", default="execgate", help="default execgate")
    p.add_argument("--runtime-path", default="/usr/local/bin/execgate",
                   help="default /usr/local/bin/execgate")


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    add_arguments(sub.add_parser(
        "configure", help="register execgate with an engine (docker, containerd, crio, podman)"),
        undo=False)
    add_arguments(sub.add_parser(
        "unconfigure", help="take execgate out of an engine's config, as it was"), undo=True)


def run(args: argparse.Namespace, out: Callable[[str], None] = print) -> int:
    undo = args.cmd == "unconfigure"
    if not _NAME.match(args.runtime_name) or not args.runtime_path.startswith("/"):
        print(f"execgatectl {args.cmd}: a runtime name of letters, digits, '_.-' and an absolute "
              "runtime path are needed", file=sys.stderr)
        return 2
    o = Options(name=args.runtime_name, path=args.runtime_path,
                set_as_default=getattr(args, "set_as_default", False),
                config=args.engine_config)
    try:
        plan: Plan = ENGINES[args.engine].plan(o, undo)
        for line in apply(plan, dry_run=args.dry_run):
            out(line)
    except InvalidConfig as e:
        print(f"execgatectl {args.cmd} {args.engine}: {e}; nothing was changed", file=sys.stderr)
        return EXIT_INVALID
    except OSError as e:
        print(f"execgatectl {args.cmd} {args.engine}: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m execgate.ctl.configure",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_parsers(sub)
    p_present = sub.add_parser("present", help="exit 0 when this host has the engine")
    p_present.add_argument("engine", choices=sorted(ENGINES))
    p_present.add_argument("--config", dest="engine_config", metavar="PATH")
    args = parser.parse_args(argv)
    if args.cmd == "present":
        return 0 if ENGINES[args.engine].present(args.engine_config) else 1
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
