"""Errors become exceptions with clear messages; a state machine's own exceptions are reported."""

import sys

import pytest
from conftest import SETTINGS, Counter, leader

import microrep


def test_invalid_settings_name_their_key_and_change_nothing():
    config = microrep.Config.local("errors", 3)
    with pytest.raises(microrep.ConfigError, match=r"node.id: is 9; the cluster has members 0..3"):
        config.set("node.id", 9)
    assert config.node_id == 0
    with pytest.raises(microrep.ConfigError, match="invalid configuration"):
        config.with_node(3)
    with pytest.raises(TypeError, match="a setting is a bool, an int or a str, not float"):
        config.set("cluster.timing.heartbeat_us", 1.5)
    config.set("node.mode", "direct")
    config.set("cluster.name", "errors-2")
    assert 'mode = "direct"' in config.to_toml()
    assert microrep.Config.parse(config.to_toml()).to_toml() == config.to_toml()


def test_bad_config_text_and_files_are_config_errors(tmp_path):
    with pytest.raises(microrep.ConfigError, match="expected a string"):
        microrep.Config.parse('[cluster]\nname = 3\n')
    missing = tmp_path / "none.toml"
    with pytest.raises(microrep.ConfigError, match=f"cannot read {missing}"):
        microrep.Config.load(missing)
    with pytest.raises(microrep.ConfigError, match="cluster.name"):
        microrep.Config.local("no spaces allowed", 3)


def test_a_state_machine_without_its_methods_is_refused():
    class Incomplete:
        def apply(self, index, command):
            return b""

    config = microrep.Config.local("incomplete", 3)
    with pytest.raises(TypeError, match=r"the state machine \(Incomplete\) lacks the method\(s\) snapshot, restore"):
        microrep.Node(config, Incomplete())


def test_a_command_too_large_for_a_slot_is_refused(cluster):
    with pytest.raises(microrep.TooLargeError, match=r"command of 100000 bytes exceeds the limit of \d+ bytes"):
        leader(cluster).propose(b"x" * 100_000)
    assert cluster.propose(b"\x01").reply  # the cluster is unharmed


class Picky(Counter):
    """Raises on the command b"boom"."""

    def apply(self, index, command):
        if command == b"boom":
            raise ValueError("boom is not a number")
        return super().apply(index, command)


def test_an_exception_in_apply_is_reported_and_replies_nothing(monkeypatch):
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    with microrep.LocalCluster(Picky, replicas=3, settings=SETTINGS) as cluster:
        cluster.propose(b"\x01")
        assert cluster.propose(b"boom").reply == b""
        assert cluster.propose(b"\x01").reply == (2).to_bytes(8, "little")
    assert reported, "the exception was not reported"
    assert all(isinstance(r.exc_value, ValueError) for r in reported)
    assert str(reported[0].exc_value) == "boom is not a number"
