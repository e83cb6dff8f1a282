"""Running the CLIs as real processes from a test: a free rendezvous port and a clean environment."""
import os
import socket
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RENDEZVOUS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def subprocess_env():
    """This environment without the test process's own rendezvous (the `distributed` fixture's world of one),
    one thread per process, unbuffered output and a free port of its own."""
    env = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO), MASTER_PORT=str(free_port()))
    return env
