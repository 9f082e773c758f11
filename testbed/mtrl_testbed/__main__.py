"""`python -m mtrl_testbed up|down|moto`: the local control plane and moto for people.

`up` starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and the node agent
under `--dir` (default .cluster/) and leaves them running; `down` stops them.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from mtrl_testbed.cluster import REPO_ROOT, LocalCluster, stop_detached
from mtrl_testbed.moto import MotoServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mtrl_testbed")
    parser.add_argument("--dir", type=Path, default=REPO_ROOT / ".cluster")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the local control plane and leave it running")
    up.add_argument("--nodes", type=int, default=2)
    sub.add_parser("down", help="stop a control plane started by `up`")
    moto = sub.add_parser("moto", help="run a moto server in the foreground")
    moto.add_argument("--port", type=int, default=5000)
    args = parser.parse_args(argv)

    if args.command == "up":
        stop_detached(args.dir)
        cluster = LocalCluster(args.dir, nodes=args.nodes).start()
        print(f"control plane up at {cluster.server}\n"
              f"  export KUBECONFIG={cluster.kubeconfig}\n"
              f"  export PATH={cluster.bin_dir}:$PATH\n"
              f"  logs: {args.dir / 'logs'}")
        return 0
    if args.command == "down":
        print("stopped" if stop_detached(args.dir) else "no control plane running")
        return 0
    server = MotoServer(port=args.port).start()
    print(f"moto server at {server.endpoint}; Ctrl-C stops it")
    signal.sigwait({signal.SIGINT, signal.SIGTERM})
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
