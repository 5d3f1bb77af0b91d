import socket

from magic.runtime import ports


def test_a_free_port_is_outside_the_kernels_ephemeral_range_and_never_given_twice():
    low, high = ports.ephemeral_range()
    given = [ports.free_port() for _ in range(200)]
    assert len(set(given)) == len(given)
    assert all(not low <= p <= high and p not in ports.AVOID and p >= ports.LOW for p in given)
    with socket.socket() as s:  # and a server can listen there
        s.bind(("0.0.0.0", given[-1]))
        s.listen()


def test_a_port_someone_listens_on_is_not_free():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert not ports.is_free(s.getsockname()[1])
