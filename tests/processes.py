"""Running the CLIs as real processes from a test: a free rendezvous port and a clean environment."""
import os
from pathlib import Path

from utils.runtime.dist import free_port

REPO = Path(__file__).resolve().parents[1]
RENDEZVOUS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT")


def subprocess_env():
    """This environment without the test process's own rendezvous (the `distributed` fixture's world of one),
    one thread per process, unbuffered output and a free port of its own."""
    env = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO), MASTER_PORT=str(free_port()))
    return env
