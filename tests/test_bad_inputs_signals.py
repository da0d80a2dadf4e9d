"""A stopping signal that comes after a run's last cell: the run exits 128+N, as its --help says,
not 0 after printing "stopping every running stage".

Why: ``make repro`` interrupted late printed the stop, then finished as if nothing happened; a
CI cancel then read as a pass.
"""
from __future__ import annotations

import signal
import threading

import pytest

from harness import cli, commands
from harness.launch import signals

pytestmark = pytest.mark.cpu


@pytest.fixture
def fresh_signals(monkeypatch):
    """The controller's stop state of its own, and no handler installed in pytest's process."""
    monkeypatch.setattr(signals, "SHUTDOWN", threading.Event())
    monkeypatch.setattr(signals, "_SIGNAL", [])
    monkeypatch.setattr(signals, "_FIRST_AT", [])
    monkeypatch.setattr(signals, "interrupt_on_signals", lambda: None)


def test_a_signal_after_the_last_cell_exits_128_plus_n(monkeypatch, capsys, fresh_signals):
    def finishes_then_stopped(args):  # the command's work done; the signal arrives after it
        signals._stop(signal.SIGINT)
        return 0

    monkeypatch.setattr(commands, "cmd_map", finishes_then_stopped)
    assert cli.main(["map"]) == 130
    assert "stopped by SIGINT: exit 130" in capsys.readouterr().err


def test_no_signal_keeps_the_commands_code(monkeypatch, fresh_signals):
    monkeypatch.setattr(commands, "cmd_map", lambda args: 0)
    assert cli.main(["map"]) == 0
    assert signals.stopped_code(1) == 1
