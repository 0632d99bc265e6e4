"""Entry of a worker process a local deployment starts: ``python -m interlock.cluster.worker_main
INSTANCE_ID`` with a ``WorkerLaunch`` as JSON on stdin and its secrets in the environment. The
instance id in argv is only a label (``ps`` shows which worker a process is); it must match the
spec's."""

from __future__ import annotations

import sys

from interlock.cluster.runner import run_command
from interlock.cluster.secrets import env_auth
from interlock.cluster.worker import WorkerLaunch, run_worker
from interlock.env import get_env


def main() -> int:
    launch = WorkerLaunch.decode(sys.stdin.buffer.read())
    if sys.argv[1:] != [launch.spec.instance_id]:
        print(
            f"worker_main: argv {sys.argv[1:]} does not name the spec's worker {launch.spec.instance_id!r}",
            file=sys.stderr,
        )
        return 2
    coro = run_worker(launch, cluster_secret=get_env().cluster_secret, auth=env_auth(launch.files))
    return run_command("interlock worker", coro, log_level=get_env().log_level)


if __name__ == "__main__":
    sys.exit(main())
