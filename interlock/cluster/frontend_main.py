"""Entry of a frontend process other than the first on one port (``cluster.frontends``):
``python -m interlock.cluster.frontend_main INDEX`` with a ``FrontendLaunch`` as JSON on stdin and
its secrets in the environment. The index in argv is only a label (``ps`` shows which process it
is); it must match the launch's."""

from __future__ import annotations

import asyncio
import signal
import sys
from dataclasses import replace

from interlock.cluster.frontends import FrontendLaunch
from interlock.cluster.runner import run_command
from interlock.cluster.secrets import env_auth
from interlock.env import get_env


async def serve(launch: FrontendLaunch) -> int:
    from interlock.cluster.builder import RunningCluster

    spec = launch.spec
    cp = replace(spec.deployment.control_plane, nats_url=launch.nats_url)
    spec = replace(
        spec,
        deployment=replace(spec.deployment, control_plane=cp),
        cluster_secret=get_env().cluster_secret,
        nats_auth=env_auth(launch.files),
    )
    running = RunningCluster(
        spec, peers=launch.peers, expect_models=launch.expect_groups, on_demand=launch.on_demand
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await running.start()  # on failure it has stopped what it started
    try:
        await stop.wait()
    finally:
        await running.close()
    return 0


def main() -> int:
    launch = FrontendLaunch.decode(sys.stdin.buffer.read())
    if sys.argv[1:] != [str(launch.peers.index)]:
        print(
            f"frontend_main: argv {sys.argv[1:]} does not name process {launch.peers.index}", file=sys.stderr
        )
        return 2
    return run_command("interlock frontend", serve(launch), log_level=get_env().log_level)


if __name__ == "__main__":
    sys.exit(main())
