"""Open bug: through the console relay, `docker exec -t` on a local terminal shows b"hi\\r\\r\\n"
where runc shows b"hi\\r\\n" (seen under TCG). Suspect: the watcher holds the pty slave until the
daemon's `done` answer, so the stream ends after the exit and the client has already restored
its terminal (ONLCR adds the \\r). Move back into the suite when fixed."""

from __future__ import annotations

from conftest import Containers, on_terminal


def test_tty_output_matches_runc_on_a_terminal(containers: Containers) -> None:
    pair = {rt: containers.run(runtime=rt) for rt in ("runc", "execgate")}
    ttys = {rt: on_terminal(["docker", "exec", "-t", cid, "echo", "hi"])
            for rt, cid in pair.items()}
    assert ttys["execgate"] == ttys["runc"] == (0, b"hi\r\n")


# Open bug: the OOM note on a TTY exec is lost (the engine tears the terminal down on exit; the
# watcher now writes on memory.events' oom_kill, which was not enough under TCG).
def test_oom_feedback_on_a_terminal(containers: Containers) -> None:
    cid = containers.run("--memory", "64m", "--memory-swap", "64m")
    rc, out = on_terminal(["docker", "exec", "-t", cid, "sh", "-c", "echo before; memhog 200"])
    assert rc == 137, out
    assert b"before" in out
    assert b"[execgate] Out of memory" in out, out
