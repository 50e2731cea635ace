"""run_scripts/discover_hosts.sh: what horovodrun's host discovery gets (no launcher needed)."""
from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "run_scripts" / "discover_hosts.sh"


def discover(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env=env or {"PATH": "/usr/bin:/bin"})


def test_prints_the_hosts_skipping_comments_and_blanks(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# workers\nnode1:4\n\n  node-2.local:2  # the second\n127.0.0.1:1")
    done = discover(str(hosts))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["node1:4", "node-2.local:2", "127.0.0.1:1"]
    from_env = discover(env={"PATH": "/usr/bin:/bin", "HVDTRAIN_HOSTS_FILE": str(hosts)})
    assert from_env.stdout == done.stdout


def test_a_bad_line_prints_nothing_and_names_the_line(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("node1:4\nnode2\nnode3:0\n")
    done = discover(str(hosts))
    assert done.returncode == 2 and done.stdout == ""
    assert "line 2: expected host:slots" in done.stderr


def test_missing_file_and_help(tmp_path):
    assert discover(str(tmp_path / "nope")).returncode == 2
    assert "no hosts file" in discover().stderr
    shown = discover("--help")
    assert shown.returncode == 0 and "usage: discover_hosts.sh" in shown.stdout
