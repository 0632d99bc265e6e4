"""Link checks (``measure_link``) and the ``interlock doctor link`` command."""

import dataclasses
import json
import socket
import time

import pytest

from interlock.cli import doctor
from interlock.errors import TransferError
from interlock.transfer import LinkStats, measure_link


def test_link_stats_estimate_and_frozen():
    stats = LinkStats(bandwidth_bytes_per_s=1e9, rtt_s=0.001, measured_at=0.0)
    assert stats.transfer_time_s(2_000_000) == pytest.approx(0.003)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.rtt_s = 0  # type: ignore[misc]


@pytest.mark.parametrize(("transport", "used"), [(None, "shm"), ("shm", "shm"), ("tcp", "tcp")])
def test_measure_link_to_another_process(agent, remote, transport, used):
    stats = measure_link(
        agent, remote.address, transport=transport, block_nbytes=4096, num_blocks=8, repeats=2, pings=3
    )
    assert stats.transport == used
    assert stats.payload_nbytes == 8 * 4096
    assert stats.bandwidth_bytes_per_s > 0 and stats.rtt_s > 0
    assert abs(stats.measured_at - time.time()) < 60


def test_measure_link_within_a_process_is_inproc(agent):
    assert (
        measure_link(agent, agent.tcp_address, block_nbytes=100, num_blocks=3, repeats=1).transport
        == "inproc"
    )


def test_measure_link_to_nobody_raises(agent):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(TransferError):
        measure_link(agent, address, timeout_s=2)


def test_doctor_link_table_and_json(capsys):
    args = ["link", "--blocks", "4", "--block-bytes", "65536", "--repeats", "1"]
    assert doctor.main(args) == 0
    rows = capsys.readouterr().out.splitlines()
    assert [r.split()[0] for r in rows[2:]] == ["inproc", "shm", "tcp"]
    assert doctor.main([*args, "--json"]) == 0
    links = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(d["link"], d["transport"]) for d in links] == [
        ("inproc", "inproc"),
        ("shm", "shm"),
        ("tcp", "tcp"),
    ]
    assert all(d["bandwidth_bytes_per_s"] > 0 for d in links)
