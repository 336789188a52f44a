"""The benchmarks whose ranks run collectives take --collective-timeout and hand it to their
workers (a frozen peer ends them in minutes, not PyTorch's 30), and a worker that loses a
peer ends in one line (issue 33, item 2)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from thinwire.cluster import ClusterSpec


@pytest.mark.parametrize("bench, call", [
    ("sync", lambda m, spec: m.run(spec, size=1000, algorithms=["allreduce"],
                                   collective_timeout_s=7.0)),
    ("dlcp", lambda m, spec: m.run(spec, 1000, 0.1, 2, 0.01, False, collective_timeout_s=7.0)),
    ("diloco", lambda m, spec: m.run(spec, ["ddp"], 2, 8, 0.05, 1, None,
                                     collective_timeout_s=7.0)),
])
def test_the_timeout_reaches_the_workers(monkeypatch, bench, call):
    import importlib

    import thinwire.cluster

    launched = []

    def fake_run(spec, command, **kwargs):
        launched.append(command)
        return 1  # the launch "fails": only its command line is of interest here

    monkeypatch.setattr(thinwire.cluster, "run", fake_run)
    module = importlib.import_module(f"thinwire.bench.{bench}")
    with pytest.raises(RuntimeError, match="failed with exit status 1"):
        call(module, ClusterSpec(2, 1, shaping=False))
    command = launched[0]
    assert command[command.index("--collective-timeout") + 1] == "7.0"


def test_a_worker_that_loses_a_peer_ends_in_one_line():
    script = textwrap.dedent("""
        from thinwire.bench.report import end_worker

        def main():
            raise RuntimeError("[gloo/pair.cc:537] Read error [10.0.0.2]:4000: Connection reset "
                               "by peer. This is typically caused by a remote worker hanging")
        end_worker(main, "thinwire bench sync")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env={"RANK": "2", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        "thinwire bench sync: error: rank 2 lost a peer in a collective: Read error "
        "[10.0.0.2]:4000: Connection reset by peer"]
