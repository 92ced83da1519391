"""A local cluster: every replica of one state machine in this process, on the shm fabric."""

import itertools
import os
import shutil
import tempfile
import time

from ._native import BackloggedError, Config, Node, NotLeaderError

_names = itertools.count()


class LocalCluster:
    """``replicas`` nodes of the state machines ``app_factory()`` makes, in this process.

    ``settings`` maps configuration keys (docs/CONFIG.md) to values, e.g.
    ``{"cluster.timing.heartbeat_us": 5000}``. The cluster's shm directory is a fresh one
    under /dev/shm (or the temp directory), removed by ``close()``.
    """

    def __init__(self, app_factory, replicas=3, name=None, settings=None):
        self.name = name or f"py-{os.getpid()}-{next(_names)}"
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.shm_dir = tempfile.mkdtemp(prefix=f"microrep-{self.name}-", dir=base)
        self.apps = []
        self.nodes = []
        try:
            self.config = Config.local(self.name, replicas, shm_dir=self.shm_dir)
            for key, value in (settings or {}).items():
                self.config.set(key, value)
            for node_id in range(replicas):
                self.start(node_id, app_factory())
        except BaseException:
            self.close()
            raise

    def start(self, node_id, app):
        """Starts (or restarts, after ``stop``) replica ``node_id`` with ``app``."""
        node = Node(self.config.with_node(node_id), app)
        if node_id < len(self.nodes):
            self.nodes[node_id], self.apps[node_id] = node, app
        else:
            self.nodes.append(node)
            self.apps.append(app)
        return node

    def stop(self, node_id):
        """Stops replica ``node_id`` (it can be started again with a fresh state machine)."""
        self.nodes[node_id].close()

    def propose(self, command, timeout=30.0):
        """Proposes ``command`` at the leader, following redirects and retrying refusals that
        wrote nothing, for at most ``timeout`` seconds; returns its ``Committed``. Other errors
        (an unknown outcome among them) are raised to the caller."""
        deadline = time.monotonic() + timeout
        at = 0
        while True:
            node = self.nodes[at]
            following = (at + 1) % len(self.nodes)
            if not node.closed:
                try:
                    return node.propose(command)
                except BackloggedError:
                    following = at
                except NotLeaderError as e:
                    if e.leader is not None and not self.nodes[e.leader].closed:
                        following = e.leader
            if time.monotonic() > deadline:
                raise TimeoutError(f"no replica of {self.name} committed {command!r} within {timeout} s")
            at = following
            time.sleep(0.0005)

    def close(self):
        """Stops every replica and removes the shm directory."""
        for node in self.nodes:
            node.close()
        shutil.rmtree(self.shm_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
