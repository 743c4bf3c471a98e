from execgate.oci import cli


def test_global_flags_every_spelling() -> None:
    inv = cli.parse(["--root", "/r", "-log=/l", "--log-format", "json", "-systemd-cgroup",
                     "--debug=false", "exec", "--detach", "x", "sh"])
    assert inv.command == "exec"
    assert inv.globals.get("root") == "/r"
    assert inv.globals.get("log") == "/l"
    assert inv.globals.get("log-format") == "json"
    assert inv.globals.is_set("systemd-cgroup")
    assert not inv.globals.is_set("debug")
    assert inv.command_args == ["--detach", "x", "sh"]


def test_no_subcommand() -> None:
    inv = cli.parse(["--version"])
    assert inv.command is None and inv.globals.is_set("version")
    assert cli.parse([]).command is None


def test_exec_flags_stop_at_the_container_id() -> None:
    inv = cli.parse(["exec", "--process", "/p.json", "-d", "--pid-file=/pid", "--console-socket",
                     "/s", "cid", "ls", "-l", "--cgroup", "x"])
    f = inv.command_flags()
    assert f.get("process") == "/p.json"
    assert f.is_set("detach")
    assert f.get("pid-file") == "/pid"
    assert f.get("console-socket") == "/s"
    assert f.positionals == ["cid", "ls", "-l", "--cgroup", "x"]
    assert f.get("cgroup") is None  # after the id: the command's own argument


def test_runc_1_2_pidfd_socket_takes_a_value_on_create_run_and_exec() -> None:
    """go-runc passes --pidfd-socket PATH (runc >= 1.2): read as a boolean, the socket's path
    became the container id and the container went unmanaged."""
    for spelling in (["--pidfd-socket", "/run/p.sock"], ["-pidfd-socket=/run/p.sock"]):
        f = cli.parse(["exec", *spelling, "--cgroup", "tool-1", "cid", "sh"]).command_flags()
        assert f.positionals[0] == "cid" and f.get("pidfd-socket") == "/run/p.sock"
        assert f.get("cgroup") == "tool-1"
        for cmd in ("create", "run"):
            g = cli.parse([cmd, *spelling, "--bundle", "/b", "cid"]).command_flags()
            assert g.positionals == ["cid"] and g.get("bundle") == "/b"


def test_repeated_and_short_flags() -> None:
    f = cli.parse(["exec", "-e", "A=1", "--env", "B=2", "-t", "-u", "0:0", "c"]).command_flags()
    assert f.values["env"] == ["A=1", "B=2"]
    assert f.is_set("tty") and f.get("user") == "0:0"


def test_create_flags_may_follow_the_id() -> None:
    f = cli.parse(["create", "cid", "--bundle", "/b", "--pid-file", "/p"]).command_flags()
    assert f.positionals == ["cid"]
    assert f.get("bundle") == "/b" and f.get("pid-file") == "/p"
    f = cli.parse(["delete", "--force", "cid"]).command_flags()
    assert f.positionals == ["cid"] and f.is_set("force")


def test_double_dash_ends_flags() -> None:
    f = cli.parse(["kill", "--", "cid", "-9"]).command_flags()
    assert f.positionals == ["cid", "-9"]


def test_splicing_keeps_everything_else() -> None:
    argv = ["--root", "/r", "exec", "--process", "/p", "cid"]
    inv = cli.parse(argv)
    assert inv.with_command_flags(["--cgroup", "tool-1"]) == [
        "--root", "/r", "exec", "--cgroup", "tool-1", "--process", "/p", "cid"]
    assert inv.argv == argv


def test_every_intercepted_subcommand_has_a_handler() -> None:
    from execgate.runtime import main

    assert sorted(main._handlers()) == sorted(main.INTERCEPTED)
