"""Where the harness's daemons listen: outside the ports outgoing connections take."""
import socket

import pytest

from localenv.daemon import NODE_PORTS, free_port, listen_ports


@pytest.mark.parametrize("ephemeral, inside, outside", [
    ((32768, 60999), [20000, 29999, 61000, 65535], [8080, 19999, 30000, 32767, 32768, 45000, 60999]),
    ((1024, 65535), [], [20000, 40000, 65535]),                       # everything ephemeral: nothing left
    ((49152, 65535), [20000, 29999, 32768, 49151], [30000, 49152]),  # the IANA range some hosts use
])
def test_listen_ports_avoid_the_ephemeral_and_node_port_ranges(ephemeral, inside, outside):
    ports = set(listen_ports(ephemeral))
    assert all(p in ports for p in inside) and not any(p in ports for p in outside)


def test_free_port_is_bindable_and_outside_the_ephemeral_range():
    low, high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    port = free_port()
    assert not low <= port <= high and port not in NODE_PORTS
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert s.getsockname()[1] == port
