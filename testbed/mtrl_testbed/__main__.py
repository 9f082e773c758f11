"""`python -m mtrl_testbed up|down|moto`: the local control plane and moto for people.

`up` starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and the node agent
under `--dir` (default .cluster/) and leaves them running; with `--operator` (`make dev-up`)
also a moto server, the example's output bucket and the operator installed by its chart, as
`make demo` does, and prints the exports to use them by hand. `down` stops all of it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from mtrl_testbed import local
from mtrl_testbed.cluster import REPO_ROOT, LocalCluster, adopt_detached, stop_detached
from mtrl_testbed.moto import MotoServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mtrl_testbed")
    parser.add_argument("--dir", type=Path, default=REPO_ROOT / ".cluster")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the local control plane and leave it running")
    up.add_argument("--nodes", type=int, default=2)
    up.add_argument("--operator", action="store_true",
                    help="also moto, the example's bucket and the operator (helm install)")
    sub.add_parser("down", help="stop a control plane started by `up`")
    moto = sub.add_parser("moto", help="run a moto server in the foreground")
    moto.add_argument("--port", type=int, default=5000)
    args = parser.parse_args(argv)

    if args.command == "up":
        stop_detached(args.dir)
        cluster = LocalCluster(args.dir, nodes=args.nodes).start()
        exports = {"KUBECONFIG": str(cluster.kubeconfig), "PATH": f"{cluster.bin_dir}:$PATH"}
        if args.operator:
            moto = MotoServer(log_path=args.dir / "moto.log", detached=True).start()
            adopt_detached(args.dir, "moto", moto.pid)
            os.environ.update(moto.env())
            bucket = local.install(cluster, moto, args.dir)
            exports |= moto.env()
            print(f"operator installed ({local.RELEASE_NAMESPACE}/{local.RELEASE}); "
                  f"outputs go to s3://{bucket} on moto at {moto.endpoint}")
        print(f"control plane up at {cluster.server}; in your shell:")
        for name, value in exports.items():
            print(f"  export {name}={value}")
        if args.operator:
            print(f"  kubectl apply -f {local.EXAMPLE.relative_to(REPO_ROOT)}; "
                  "kubectl get mtrlruns -w")
        print(f"logs: control plane {args.dir / 'logs'}, pods (the operator's too) "
              f"{args.dir / 'pods'}/<namespace>_<pod>_<uid>/<container>.log"
              f"{', moto ' + str(args.dir / 'moto.log') if args.operator else ''}")
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
