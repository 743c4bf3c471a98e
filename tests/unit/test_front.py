"""The compiled front (runtime/front.c), built with the host's cc and run as a real process
against a fake runc and a fake Python entry point (each records its argv and environment) and
container records in a temp state dir: what it passes through, byte for byte, and what it leaves
to Python."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.common import config, frontconf
from execgate.oci import cli, runc
from execgate.runtime import front, launcher

pytestmark = pytest.mark.skipif(front.compiler() is None, reason="no C compiler")

SRC = Path(__file__).resolve().parents[2]
# A recorder: its argv and environment, as bytes, NUL-separated, then exit 0.
RECORDER = """#!{python} -IS
import os, sys
with open({out!r}, "wb") as f:
    f.write(b"\\0".join(os.fsencode(a) for a in sys.argv) + b"\\n")
    f.write(b"\\0".join(k + b"=" + v for k, v in os.environb.items()))
"""


class Box:
    """A temp dir with the front built in it, a fake runc, a fake Python entry, a config file,
    its front file and a state dir."""

    def __init__(self, root: Path, binary: Path, conf_front: Path) -> None:
        self.root = root
        self.front = binary
        self.front_conf = conf_front
        self.runc_out = root / "runc.out"
        self.python_out = root / "python.out"
        self.runc = root / "runc"
        self.python = root / "execgate-py"
        self.conf = root / "config.toml"
        self.state = root / "state"
        (self.state / "containers").mkdir(parents=True)
        for path, out in ((self.runc, self.runc_out), (self.python, self.python_out)):
            path.write_text(RECORDER.format(python=sys.executable, out=str(out)))
            path.chmod(0o755)
        self.conf.write_text("# the front never reads this\n")
        self.env = {k: v for k, v in os.environ.items() if k != runc.LOOP_MARKER}
        self.env.update(EXECGATE_CONFIG=str(self.conf), PATH="/usr/bin:/bin")
        self.configure()

    def configure(self, **settings: object) -> None:
        """Write the front file as the Python runtime would, for these settings."""
        settings.setdefault("runtime", (str(self.runc),))
        settings.setdefault("state_dir", str(self.state))
        cfg = config.Config(**settings)
        frontconf.write(str(self.front_conf), str(self.conf), os.stat(self.conf), cfg,
                        (config.__file__,))

    def record(self, cid: str, text: str | dict[str, object]) -> None:
        path = self.state / "containers" / f"{cid}.json"
        path.write_text(text if isinstance(text, str) else json.dumps(text))

    def run(self, *argv: str | bytes, env: dict[str, str] | None = None
            ) -> tuple[str, list[bytes], dict[bytes, bytes], bytes]:
        """Run the front: who it became ("runc", "python"), with which argv and environment,
        and what it printed."""
        for out in (self.runc_out, self.python_out):
            out.unlink(missing_ok=True)
        p = subprocess.run([str(self.front), *argv], env=self.env if env is None else env,
                           capture_output=True, timeout=20)
        assert p.returncode == 0, p.stderr
        reached = [name for name, out in (("runc", self.runc_out), ("python", self.python_out))
                   if out.exists()]
        assert len(reached) == 1, (reached, p.stderr)
        args, _, env_blob = (self.runc_out if reached[0] == "runc" else self.python_out
                             ).read_bytes().partition(b"\n")
        got_env = dict(e.split(b"=", 1) for e in env_blob.split(b"\0") if e)
        return reached[0], args.split(b"\0"), got_env, p.stdout

    def expect(self, who: str, *argv: str | bytes) -> None:
        """The front became who, with argv untouched (and, for runc, the loop marker)."""
        reached, args, env, _ = self.run(*argv)
        assert reached == who, argv
        target = self.runc if who == "runc" else self.python
        assert args == [os.fsencode(str(target)), *(os.fsencode(a) for a in argv)]
        want = {os.fsencode(k): os.fsencode(v) for k, v in self.env.items()}
        if who == "runc":
            want[runc.LOOP_MARKER.encode()] = b"1"
        assert env == want


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    d = tmp_path_factory.mktemp("front")
    binary, conf = d / "execgate", d / "front.conf"
    front.build(str(binary), str(d / "box" / "execgate-py"), front_conf=str(conf),
                extra=("-Werror",))
    return d, binary, conf


@pytest.fixture
def box(built: tuple[Path, Path, Path]) -> Iterator[Box]:
    d, binary, conf = built
    root = d / "box"
    if root.exists():
        subprocess.run(["rm", "-rf", str(root)], check=True)
    root.mkdir()
    yield Box(root, binary, conf)
    conf.unlink(missing_ok=True)


@pytest.mark.parametrize("argv", [
    ["state", "box"],
    ["--root", "/run/docker/runtime-runc/moby", "--log", "/l.json", "--log-format", "json",
     "state", "box"],
    ["--root=/r", "-debug", "--systemd-cgroup", "events", "--stats", "box"],
    ["ps", "--format", "json", "box"],
    ["update", "--memory", "1g", "box"],
    ["pause", "box"], ["resume", "box"], ["checkpoint", "box"], ["features"], [],
    ["--help"], ["spec"], ["create-not", "box"], ["state", "we ird", "", "\u00e9"],
])
def test_a_passthrough_is_runcs_own_call_without_python(box: Box, argv: list[str]) -> None:
    box.record("box", {"id": "box", "managed": True, "prepared": True})
    box.expect("runc", *argv)


def test_argv_reaches_runc_byte_for_byte(box: Box) -> None:
    box.expect("runc", b"--root", b"/r\xff\x01", b"state", b"b\xfe x")


def test_version_says_execgates_before_runcs(box: Box) -> None:
    from execgate import __version__

    for argv in (["--version"], ["-v"], ["--log", "/l", "--version=true"]):
        reached, args, _, out = box.run(*argv)
        assert reached == "runc" and args[1:] == [a.encode() for a in argv]
        assert out == f"execgate version {__version__}\nreal runtime: {box.runc}\n".encode()
    reached, _, _, out = box.run("--version=false")
    assert reached == "runc" and out == b""


def test_a_managed_containers_calls_go_to_python(box: Box) -> None:
    box.record("box", {"id": "box", "managed": True, "prepared": False, "cgroup": "/cg"})
    for argv in (["exec", "--process", "/p.json", "--detach", "--pid-file", "/pid", "box"],
                 ["--root", "/r", "kill", "box", "9"], ["kill", "--all", "box", "KILL"],
                 ["start", "box"], ["delete", "--force", "box"],
                 ["create", "--bundle", "/b", "--pid-file", "/p", "box"]):
        box.expect("python", *argv)
    box.record("box", {"id": "box", "managed": True, "prepared": True})
    box.expect("runc", "start", "box")  # prepared already: nothing left to do
    box.expect("python", "exec", "-p", "/p.json", "box")


def test_an_unmanaged_containers_calls_go_to_runc(box: Box) -> None:
    box.record("plain", {"id": "plain", "created": 1.5, "managed": False,
                         "annotations": {"managed": "true", "x": {"managed": True}},
                         "reason": "OSError: no \"cgroup\" \\ v2 \u00e9"})
    box.record("old", {"id": "old"})  # no "managed" at all: not managed, as in Python
    for cid in ("plain", "old", "none"):  # "none": no record at all
        for argv in (["exec", "--process", "/p.json", "--console-socket", "/s", "-t", cid],
                     ["kill", cid, "15"], ["start", cid]):
            box.expect("runc", *argv)
    box.expect("runc", "delete", "none")
    box.expect("python", "delete", "plain")  # a record to remove
    box.expect("python", "create", "none")  # create is always Python's


def test_doubt_goes_to_python(box: Box) -> None:
    box.record("box", {"id": "box", "managed": False})
    for argv in (["--bogus", "state", "box"],  # a newer runc's flag: may take a value
                 ["--root"],  # a value missing
                 ["--", "state", "box"],
                 ["exec", "--new-flag", "box"], ["exec", "--process"],
                 ["kill", "--signal", "9", "box"], ["delete", "--", "box"],
                 ["start", "--x", "box"], ["exec"], ["kill"],
                 ["exec", ".hidden"], ["kill", "a/b"], ["delete", ""]):
        box.expect("python", *argv)


@pytest.mark.parametrize("text", [
    "", "{", "[]", '{"managed": 1}', '{"managed": "false"}', '{"managed": null}',
    '{"man\\u0061ged": false}', '{"managed": false,}', '{"managed": false} x',
    '{"managed": false, "v": NaN}', '{"managed": false, "s": "\u00e9"}',
    '{"managed": false, "s": "a\nb"}', '{"managed": false, "s": "\\q"}',
    '{"managed": false, "n": ' + "[" * 100 + "]" * 100 + "}",
])
def test_a_record_it_cannot_read_goes_to_python(box: Box, text: str) -> None:
    box.record("box", text)
    box.expect("python", "exec", "box")


def test_an_unreadable_record_goes_to_python(box: Box) -> None:
    (box.state / "containers" / "box.json").mkdir()
    box.expect("python", "kill", "box", "9")


def test_per_exec_cgroups_off_passes_everything_through(box: Box) -> None:
    box.record("box", {"id": "box", "managed": True, "prepared": False})
    box.configure(per_exec_cgroups=False)
    for argv in (["create", "box"], ["start", "box"], ["exec", "box"], ["delete", "box"]):
        box.expect("runc", *argv)


def test_a_stale_or_foreign_front_file_goes_to_python(box: Box) -> None:
    box.expect("runc", "state", "box")
    box.conf.write_text("# edited\n")  # the config changed: the front file is stale
    box.expect("python", "state", "box")
    box.configure()
    box.expect("runc", "state", "box")
    box.front_conf.chmod(0o666)
    box.expect("python", "state", "box")
    box.front_conf.chmod(0o600)
    text = box.front_conf.read_text()
    for broken in (text.replace("end\n", ""), text.replace("execgate-front 1", "execgate-front 2"),
                   text + "runtime x\n", text.replace("state_dir", "newkey"),
                   text.replace("per_exec_cgroups 1", "per_exec_cgroups yes"), ""):
        box.front_conf.write_text(broken)
        box.expect("python", "state", "box")
    box.front_conf.unlink()
    box.expect("python", "state", "box")


def test_another_config_path_goes_to_python(box: Box) -> None:
    other = box.root / "other.toml"
    other.write_text(box.conf.read_text())
    os.utime(other, ns=(os.stat(box.conf).st_atime_ns, os.stat(box.conf).st_mtime_ns))
    for path in (str(other), "config.toml"):
        reached, *_ = box.run("state", "x", env={**box.env, "EXECGATE_CONFIG": path})
        assert reached == "python"


def test_no_config_file_uses_the_recorded_defaults(box: Box) -> None:
    box.conf.unlink()
    cfg = config.Config(runtime=(str(box.runc),), state_dir=str(box.state))
    frontconf.write(str(box.front_conf), str(box.conf), None, cfg, (config.__file__,))
    box.expect("runc", "state", "box")
    box.conf.write_text("")  # it appeared since
    box.expect("python", "state", "box")


def test_runtime_not_found_or_itself_goes_to_python(box: Box) -> None:
    box.configure(runtime=("no-such-runtime-anywhere", str(box.root / "missing")))
    box.expect("python", "state", "box")
    box.configure(runtime=(str(box.front),))
    box.expect("python", "state", "box")
    script = box.root / "other-execgate"  # another copy of the Python runtime
    script.write_text(launcher.render(sys.executable, []))
    script.chmod(0o755)
    box.configure(runtime=(str(script), str(box.runc)))  # skipped, as runc.find does
    box.expect("runc", "state", "box")


def test_runtime_found_on_path_as_python_finds_it(box: Box) -> None:
    bin_dir = box.root / "bin"
    bin_dir.mkdir()
    (bin_dir / "myrunc").symlink_to(box.runc)
    box.configure(runtime=("myrunc",))
    box.env["PATH"] = f"/nonexistent:{bin_dir}:/usr/bin"
    reached, args, _, _ = box.run("state", "box")
    assert reached == "runc" and args[0] == str(bin_dir / "myrunc").encode()
    assert args[0].decode() == runc.which("myrunc", box.env["PATH"] + ":" + runc.SEARCH_PATH)


def test_a_loop_goes_to_python(box: Box) -> None:
    reached, _, env, _ = box.run("state", "box", env={**box.env, runc.LOOP_MARKER: "1"})
    assert reached == "python" and env[runc.LOOP_MARKER.encode()] == b"1"


def _python_passes_through(argv: list[str], state: Path) -> bool:
    """Whether runtime/main.py and its handlers leave argv to runc untouched (the oracle)."""
    inv = cli.parse(argv)
    if inv.command not in ("create", "start", "exec", "kill", "delete"):
        return True
    if inv.command == "create":
        return False
    flags = inv.command_flags()
    if not flags.positionals:
        return True
    from execgate.common import records

    rec = records.load_container(str(state), flags.positionals[0])
    if inv.command == "delete":
        return rec is None
    if inv.command == "exec" and flags.get("cgroup") is not None:
        return True
    managed = bool(rec and rec.get("managed"))
    return not managed or (inv.command == "start" and bool(rec and rec.get("prepared")))


def test_it_passes_through_only_what_python_would(box: Box) -> None:
    """Random command lines: whatever the front hands to runc itself, Python would have too."""
    box.record("m", {"id": "m", "managed": True, "prepared": False})
    box.record("p", {"id": "p", "managed": True, "prepared": True})
    box.record("u", {"id": "u", "managed": False})
    globals_ = ["--root", "/r", "--log=x", "-log", "--debug", "-v", "--help", "--x", "--"]
    commands = ["create", "start", "exec", "kill", "delete", "state", "-", "m"]
    flags = ["--process", "-p", "--detach", "-t", "--cgroup", "c", "--all", "-f", "--", "-",
             "9", "=", "--pid-file=/x", "--force"]
    ids = ["m", "p", "u", "n", ".", ""]
    rng = random.Random(17)

    def some(tokens: list[str], most: int) -> list[str]:
        return [rng.choice(tokens) for _ in range(rng.randint(0, most))]

    direct = 0
    for _ in range(150):
        argv = [*some(globals_, 2), rng.choice(commands), *some(flags, 2), rng.choice(ids),
                *some(flags + ids, 2)]
        reached, args, _, _ = box.run(*argv)
        if reached == "runc":
            direct += 1
            assert args[1:] == [a.encode() for a in argv]
            assert _python_passes_through(argv, box.state), argv
    assert direct > 20  # the test sees both ways


def test_the_real_python_runtime_writes_the_file_the_front_reads(
        box: Box, built: tuple[Path, Path, Path]) -> None:
    """End to end: the first call finds no front file and starts Python (the runtime itself,
    recording that it ran); Python passes it through and writes the file; the next goes direct."""
    box.front_conf.unlink()
    box.conf.write_text(f'runtime = "{box.runc}"\nstate_dir = "{box.state}"\n')
    cache = box.front_conf.parent / "config.cache"
    assert frontconf.path_for(str(cache)) == str(box.front_conf)
    box.python.write_text(f"""#!{sys.executable} -IS
import sys
sys.path.insert(0, {str(SRC)!r})
open({str(box.python_out)!r}, "wb").close()
from execgate.common import config
config.CACHE_PATH, config.SETTLE_NS = {str(cache)!r}, 0
from execgate.runtime.main import main
main()
""")
    p = subprocess.run([str(box.front), "state", "box"], env=box.env, capture_output=True)
    assert p.returncode == 0, p.stderr
    assert box.python_out.exists() and box.runc_out.exists()
    assert box.front_conf.exists()
    box.expect("runc", "--root", "/r", "state", "box")
    box.conf.write_text(f'runtime = "{box.runc}"\nno_such_key = 1\n')  # a warning each call
    subprocess.run([str(box.front), "state", "box"], env=box.env, check=True)
    assert not box.front_conf.exists()
    box.python_out.unlink()
    subprocess.run([str(box.front), "state", "box"], env=box.env, check=True)
    assert box.python_out.exists()
    cache.unlink()


def test_the_front_file_is_written_once_and_removed_when_python_must_run(tmp_path: Path) -> None:
    conf, front_conf = tmp_path / "config.toml", tmp_path / "front.conf"
    conf.write_text("")
    cfg = config.Config(runtime=("/usr/bin/runc",))
    frontconf.write(str(front_conf), str(conf), os.stat(conf), cfg, (config.__file__,))
    first = os.stat(front_conf)
    assert first.st_mode & 0o777 == 0o600
    assert "runtime /usr/bin/runc\n" in front_conf.read_text()
    frontconf.write(str(front_conf), str(conf), os.stat(conf), cfg, (config.__file__,))
    assert os.stat(front_conf).st_ino == first.st_ino  # the same: not rewritten
    for must_run in (config.Config(errors=("bad",)), config.Config(debug_log="/l"),
                     config.Config(state_dir="/a\nb")):
        frontconf.write(str(front_conf), str(conf), os.stat(conf), cfg, (config.__file__,))
        frontconf.write(str(front_conf), str(conf), os.stat(conf), must_run, (config.__file__,))
        assert not front_conf.exists()


# -- a managed exec, handed to the daemon (daemon/exec_op.py) -------------------------------------


class FakeDaemon:
    """The daemon's socket as the front meets it: each connection's request is kept, and the
    frames of `script` (maps, or raw bytes) are sent in turn; None: hang up; "READ": read
    the front's next frame (kept too). Silent (empty script): it reads and never answers."""

    def __init__(self, path: Path, script: list[object]) -> None:
        import socket
        import threading

        self.path, self.script, self.requests = path, script, []
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(str(path))
        self.sock.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        import struct

        import msgpack

        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            head = conn.recv(4, 0x100)  # MSG_WAITALL
            (n,) = struct.unpack(">I", head)
            body = b""
            while len(body) < n:
                body += conn.recv(n - len(body))
            self.requests.append(msgpack.unpackb(body, raw=False))
            if not self.script:
                conn.recv(1)  # until the front hangs up
                return
            for frame in self.script:
                if frame is None:
                    return
                if isinstance(frame, float):  # a daemon late by that many seconds
                    time.sleep(frame)
                    continue
                if frame == "READ":  # the front's next frame (a lifecycle's status)
                    head = conn.recv(4, 0x100)
                    (n,) = struct.unpack(">I", head)
                    self.requests.append(msgpack.unpackb(conn.recv(n, 0x100), raw=False))
                    continue
                blob = frame if isinstance(frame, bytes) else msgpack.packb(frame)
                conn.sendall(struct.pack(">I", len(blob)) + blob)
            conn.recv(1)

    def close(self) -> None:
        self.sock.close()
        self.path.unlink(missing_ok=True)


def _with_daemon(box: Box, script: list[object], *argv: str, prepared: bool = True,
                 runc_status: int = 0, timeout_ms: int = 300
                 ) -> tuple[str, list[bytes], subprocess.CompletedProcess[bytes], FakeDaemon]:
    """Run the front on a managed container "box" beside a FakeDaemon playing script: whom it
    became (runc, python) with which argv, the front's process, and the daemon."""
    sock = box.root / "d.sock"
    box.configure(socket=str(sock), daemon_timeout_ms=timeout_ms)
    box.record("box", {"id": "box", "managed": True, "prepared": prepared})
    box.runc.write_text(RECORDER.format(python=sys.executable, out=str(box.runc_out))
                        + f"sys.exit({runc_status})\n")
    daemon = FakeDaemon(sock, script)
    try:
        for out in (box.runc_out, box.python_out):
            out.unlink(missing_ok=True)
        p = subprocess.run([str(box.front), *argv], env=box.env, capture_output=True,
                           timeout=20)
        who = "runc" if box.runc_out.exists() else "python"
        args = (box.runc_out if who == "runc" else box.python_out).read_bytes()
        return who, args.partition(b"\n")[0].split(b"\0"), p, daemon
    finally:
        daemon.close()


def _managed_exec(box: Box, script: list[object], *argv: str, timeout_ms: int = 300
                  ) -> tuple[str, list[bytes], bytes, FakeDaemon]:
    who, args, p, daemon = _with_daemon(box, script, *argv, timeout_ms=timeout_ms)
    assert p.returncode == 0, p.stderr
    return who, args, p.stderr, daemon

EXEC = ["--root", "/run/r", "--log", "/l.json", "exec", "--process", "/p.json", "--detach",
        "--pid-file", "/pid", "box"]


def test_a_managed_exec_runs_the_argv_the_daemon_answers_with_no_python(box: Box) -> None:
    placed = [*EXEC[:5], "--cgroup", "tool-0123456789ab", *EXEC[5:]]
    who, args, err, daemon = _managed_exec(box, [
        {"v": 1, "ok": True, "queued": True, "max_wait_s": 30.0, "progress_s": 10.0,
         "max_queued_s": 600, "say": ""},
        {"v": 1, "ok": True, "waiting": True, "say": "[execgate] waiting 10s\n"},
        {"v": 1, "ok": True, "admitted": True, "argv": placed,
         "say": "[execgate] waited 12s\n"}], *EXEC)
    assert who == "runc" and args == [str(box.runc).encode(), *(a.encode() for a in placed)]
    assert err == b"[execgate] waiting 10s\n[execgate] waited 12s\n"
    (req,) = daemon.requests
    assert req == {"v": 1, "op": "exec", "config": str(box.conf), "argv": EXEC}


@pytest.mark.parametrize("script", [
    [{"v": 1, "ok": False, "error": "a TTY call is the runtime's"}],
    [{"v": 1, "ok": True, "queued": True, "max_wait_s": 30.0}, None],  # died while waiting
    [b"\xc1 not msgpack"],
    [{"v": 1, "ok": True, "argv": ["exec", 7]}],  # an argv that is not all strings
    [{"v": 1, "ok": True}],  # neither queued nor an argv
    [],  # silent: the budget passes
])
def test_a_daemon_that_does_not_place_the_exec_leaves_it_to_python(
        box: Box, script: list[object]) -> None:
    who, args, _err, daemon = _managed_exec(box, script, *EXEC)
    assert who == "python" and args == [str(box.python).encode(), *(a.encode() for a in EXEC)]
    assert len(daemon.requests) == 1


def _python_env(box: Box) -> dict[bytes, bytes]:
    blob = box.python_out.read_bytes().partition(b"\n")[2]
    return dict(e.split(b"=", 1) for e in blob.split(b"\0") if e)


def test_a_daemon_lost_after_queued_tells_python_to_run_the_call_at_once(box: Box) -> None:
    """The daemon took the exec or the create (`queued`), then died: Python gets DAEMON_LOST
    and runs it without asking again. Asked again, a restarted daemon queued three calls a
    second time in the VM (101-108 s more). Trouble before `queued` leaves Python to ask."""
    lost = frontconf.DAEMON_LOST.encode()
    queued = {"v": 1, "ok": True, "queued": True, "max_wait_s": 30.0, "progress_s": 10.0,
              "max_queued_s": 600}
    who, _args, _err, _daemon = _managed_exec(box, [queued, None], *EXEC)
    assert who == "python" and _python_env(box).get(lost) == b"1"
    # died before it answered (it had the request): the same
    who, _args, _err, _daemon = _managed_exec(box, [None], *EXEC)
    assert who == "python" and _python_env(box).get(lost) == b"1"
    for script in ([{"v": 1, "ok": False, "error": "no"}], []):  # a refusal; silent past budget
        who, _args, _err, _daemon = _managed_exec(box, script, *EXEC)
        assert who == "python" and lost not in _python_env(box)
    create = ["create", "--bundle", "/b", "--pid-file", "/p", "new"]
    who, _args, _rc, _daemon = _lifecycle(box, [dict(queued, max_wait_s=5.0), None], *create)
    assert who == "python" and _python_env(box).get(lost) == b"1"


def test_a_late_daemon_is_waited_for_not_taken_for_dead(box: Box) -> None:
    """At 15x under TCG the daemon's progress frames came up to 15 s apart; fronts that gave
    up after one missed frame (progress_s + 5 s) ran 9 calls unmanaged into a full host and
    2 were OOM-killed. Silence for two periods and a bit is still a daemon at work."""
    placed = [*EXEC[:5], "--cgroup", "tool-0123456789ab", *EXEC[5:]]
    who, args, _err, _daemon = _managed_exec(box, [
        {"v": 1, "ok": True, "queued": True, "max_wait_s": 30.0, "progress_s": 2.0,
         "max_queued_s": 600},
        8.0,  # the old bound was 2 + 5 s
        {"v": 1, "ok": True, "admitted": True, "argv": placed}], *EXEC)
    assert who == "runc" and args == [str(box.runc).encode(), *(a.encode() for a in placed)]


def test_a_tty_exec_or_a_placed_one_never_asks_the_daemon(box: Box) -> None:
    tty = [*EXEC[:5], "--console-socket", "/c.sock", *EXEC[5:]]
    who, _args, _err, daemon = _managed_exec(box, [], *tty)
    assert who == "python" and daemon.requests == []
    placed = [*EXEC[:5], "--cgroup=tool-x", *EXEC[5:]]
    who, args, _err, daemon = _managed_exec(box, [], *placed)
    assert who == "runc" and daemon.requests == []
    assert args[1:] == [a.encode() for a in placed]


def test_without_a_daemon_a_managed_exec_goes_to_python_at_once(box: Box) -> None:
    box.configure(socket=str(box.root / "none.sock"))
    box.record("box", {"id": "box", "managed": True, "prepared": True})
    box.expect("python", *EXEC)


def _lifecycle(box: Box, script: list[object], *argv: str, runc_status: int = 0
               ) -> tuple[str, list[bytes], int, FakeDaemon]:
    who, args, p, daemon = _with_daemon(box, script, *argv, prepared=False,
                                        runc_status=runc_status)
    return who, args, p.returncode, daemon

@pytest.mark.parametrize("command", [["start", "box"], ["delete", "--force", "box"]])
def test_a_managed_start_or_delete_runs_runc_then_tells_the_daemon_how_it_ended(
        box: Box, command: list[str]) -> None:
    argv = ["--root", "/run/r", *command]
    script = [{"v": 1, "ok": True, "run": "child"}, "READ", {"v": 1, "ok": True}]
    who, args, rc, daemon = _lifecycle(box, script, *argv, runc_status=3)
    assert who == "runc" and args == [str(box.runc).encode(), *(a.encode() for a in argv)]
    assert rc == 3  # runc's own exit status
    assert daemon.requests == [{"v": 1, "op": "lifecycle", "config": str(box.conf),
                                "argv": argv}, {"v": 1, "status": 3}]


def test_a_managed_kill_becomes_runc_once_the_daemon_has_thawed(box: Box) -> None:
    who, args, rc, daemon = _lifecycle(box, [{"v": 1, "ok": True, "run": "exec"}],
                                       "kill", "box", "KILL")
    assert who == "runc" and rc == 0 and args[1:] == [b"kill", b"box", b"KILL"]
    assert len(daemon.requests) == 1


@pytest.mark.parametrize("script", [[{"v": 1, "ok": False, "error": "no"}], [],
                                    [{"v": 1, "ok": True, "run": "later"}]])
def test_a_lifecycle_the_daemon_does_not_take_goes_to_python(box: Box,
                                                             script: list[object]) -> None:
    who, args, _rc, _daemon = _lifecycle(box, script, "delete", "box")
    assert who == "python" and args[1:] == [b"delete", b"box"]


def test_a_daemon_that_dies_while_runc_runs_costs_nothing_but_its_work(box: Box) -> None:
    who, _args, rc, _daemon = _lifecycle(box, [{"v": 1, "ok": True, "run": "child"}, None],
                                         "start", "box")
    assert who == "runc" and rc == 0


def test_a_create_waits_for_its_sandboxs_admission_then_runs_runc(box: Box) -> None:
    argv = ["create", "--bundle", "/b", "--pid-file", "/p", "new"]
    script = [{"v": 1, "ok": True, "queued": True, "max_wait_s": 5.0},
              {"v": 1, "ok": True, "run": "child"}, "READ", {"v": 1, "ok": True}]
    who, args, rc, daemon = _lifecycle(box, script, *argv)
    assert who == "runc" and rc == 0 and args[1:] == [a.encode() for a in argv]
    assert daemon.requests[1] == {"v": 1, "status": 0}
    # Silent after `queued` past max_wait_s: the Python runtime decides (and fails open).
    script = [{"v": 1, "ok": True, "queued": True, "max_wait_s": 0.1}]
    who, _args, _rc, _daemon = _lifecycle(box, script, *argv)
    assert who == "python"


@pytest.mark.parametrize("sig", [15, 2])
def test_a_signal_to_the_front_reaches_the_runc_it_runs_and_it_exits_as_runc_did(
        box: Box, sig: int) -> None:
    """Issue 21, item 11: while runc runs as the front's child (the daemon has work after
    it), a stopping signal sent to the front (the engine's timeout) goes on to runc, and the
    front ends as runc did, killed by that signal, which the daemon is told."""
    import time

    sock = box.root / "d.sock"
    box.configure(socket=str(sock), daemon_timeout_ms=2000)
    box.record("box", {"id": "box", "managed": True, "prepared": False})
    box.runc.write_text(RECORDER.format(python=sys.executable, out=str(box.runc_out))
                        + "import time\ntime.sleep(30)\n")
    box.runc_out.unlink(missing_ok=True)
    daemon = FakeDaemon(sock, [{"v": 1, "ok": True, "run": "child"}, "READ",
                               {"v": 1, "ok": True}])
    try:
        p = subprocess.Popen([str(box.front), "--root", "/run/r", "start", "box"],
                             env=box.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while not box.runc_out.exists():  # runc (the recorder) is running as the child
            assert time.monotonic() < deadline and p.poll() is None, "runc never started"
            time.sleep(0.02)
        t0 = time.monotonic()
        p.send_signal(sig)
        rc = p.wait(timeout=10)
        daemon.thread.join(5)
    finally:
        daemon.close()
    assert time.monotonic() - t0 < 5  # not runc's 30 s: it got the signal
    assert rc == -sig, p.stderr.read() if p.stderr else rc
    assert daemon.requests[1:] == [{"v": 1, "status": -sig}]
