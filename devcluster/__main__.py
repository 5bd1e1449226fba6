"""`python -m devcluster up|down|status`: the test cluster in the background, for people.

Entry point of the test cluster (devcluster/), on top of localcluster.py.

    eval "$(python -m devcluster up --kwok-nodes 4 --operator)"   # prints the exports
    eval "$(python -m devcluster up --kueue)"                     # with Kueue (devcluster/kueue.py)
    kubectl get nodes
    python -m devcluster restart-apiserver [--down 5] [--etcd]     # an outage, on demand
    python -m devcluster down

`up` builds the binaries on first use (tens of minutes once per machine), wipes and reuses the
state folder (default /tmp/monarch-spmd-cluster, or MONARCH_SPMD_CLUSTER_DIR), starts a background
process that runs the cluster (pid in <state>/cluster.pid, its log in <state>/cluster.log) and
prints `export KUBECONFIG=...` and `export PATH=<bin>:$PATH` on stdout once the cluster is
ready. Component logs: <state>/<component>.log; container logs:
<state>/logs/<namespace>/<pod>/<container>.log (or `kubectl logs`); the operator's:
<state>/operator.log; Kueue's: <state>/kueue/kueue.log. `down` stops it all and removes the pod
bridge and network namespaces.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from devcluster.binaries import ensure_binaries
from devcluster.kueue import ensure_kueue
from devcluster.localcluster import REPO_ROOT, LocalCluster
from devcluster.podnetwork import Bridge
from devcluster.realnode import clean_slot, ensure_images, ensure_realnode_binaries

DEFAULT_DIR = Path(os.environ.get("MONARCH_SPMD_CLUSTER_DIR", "/tmp/monarch-spmd-cluster"))


def running_pid(state_dir: Path) -> int | None:
    """The pid of the background cluster process of `state_dir`, if it is alive."""
    try:
        pid = int((state_dir / "cluster.pid").read_text())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def exports(state_dir: Path) -> str:
    info = json.loads((state_dir / "ready").read_text())
    return (f"export KUBECONFIG={info['kubeconfig']}\n"
            f"export PATH={info['bin_dir']}:$PATH\n")


def up(args: argparse.Namespace) -> int:
    state_dir = args.state_dir
    if running_pid(state_dir):
        print(f"already up ({state_dir})", file=sys.stderr)
        print(exports(state_dir), end="")
        return 0
    ensure_binaries()  # in the foreground, so a first build shows its progress
    shutil.rmtree(state_dir, ignore_errors=True)
    state_dir.mkdir(parents=True)
    command = [sys.executable, "-m", "devcluster", "serve", "--state-dir", str(state_dir),
               "--kwok-nodes", str(args.kwok_nodes), "--gpus", str(args.gpus)]
    if args.operator:
        command.append("--operator")
    if args.kueue:
        ensure_kueue()  # in the foreground too: the first build on a machine takes minutes
        command.append("--kueue")
    if args.real_nodes:
        ensure_realnode_binaries()  # and the images: the first build on a machine takes minutes
        ensure_images()
        command += ["--real-nodes", str(args.real_nodes)]
    with open(state_dir / "cluster.log", "ab") as log:
        proc = subprocess.Popen(command, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + args.timeout
    while not (state_dir / "ready").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = (state_dir / "cluster.log").read_text(errors="replace")[-3000:]
            print(f"the cluster did not start; {state_dir / 'cluster.log'}:\n{tail}",
                  file=sys.stderr)
            if proc.poll() is None:
                proc.terminate()
            return 1
        time.sleep(0.2)
    info = json.loads((state_dir / "ready").read_text())
    print(f"cluster up in {info['start_seconds']}s; state in {state_dir}; "
          f"stop it with: python -m devcluster down", file=sys.stderr)
    print(exports(state_dir), end="")
    return 0


RESTART_REQUEST = "restart-apiserver.json"
RESTART_DONE = "restart-apiserver.done"


def serve(args: argparse.Namespace) -> int:
    """Run the cluster in the foreground until SIGTERM or SIGINT; SIGUSR1 restarts the API server."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop = threading.Event()
    restart = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: (restart.set(), stop.set()))
    (args.state_dir / "cluster.pid").write_text(str(os.getpid()))
    cluster = LocalCluster(args.state_dir, kwok_nodes=args.kwok_nodes, gpus=args.gpus,
                           operator=args.operator, real_nodes=args.real_nodes, kueue=args.kueue)
    try:
        cluster.start()
        (args.state_dir / "ready").write_text(json.dumps(cluster.describe()))
        print(f"ready: {cluster.describe()}", flush=True)
        while True:
            stop.wait()
            if not restart.is_set():
                break
            restart.clear()
            stop.clear()
            request = json.loads((args.state_dir / RESTART_REQUEST).read_text())
            outage = cluster.restart_apiserver(down_seconds=request["down"], etcd=request["etcd"])
            (args.state_dir / RESTART_DONE).write_text(f"{outage:.1f}")
            print(f"API server restarted; outage {outage:.1f}s", flush=True)
    finally:
        print("stopping", flush=True)
        cluster.stop()
        (args.state_dir / "cluster.pid").unlink(missing_ok=True)
        (args.state_dir / "ready").unlink(missing_ok=True)
    return 0


def down(args: argparse.Namespace) -> int:
    state_dir = args.state_dir
    pid = running_pid(state_dir)
    if pid:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while running_pid(state_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        if running_pid(state_dir):
            os.killpg(pid, signal.SIGKILL)
    # Whatever a killed cluster process left behind: its pod namespaces and bridge.
    bridge_file = state_dir / "bridge"
    if bridge_file.exists():
        Bridge(int(bridge_file.read_text().removeprefix("spmdbr"))).destroy()
        bridge_file.unlink()
    slot_file = state_dir / "realnode" / "slot"  # and the network, processes of its real nodes
    if slot_file.exists():
        clean_slot(int(slot_file.read_text()))
        slot_file.unlink()
    (state_dir / "cluster.pid").unlink(missing_ok=True)
    print(f"cluster down; logs kept in {state_dir}", file=sys.stderr)
    return 0


def restart_apiserver(args: argparse.Namespace) -> int:
    """Asks the running cluster to kill its API server (and etcd) and start it again."""
    pid = running_pid(args.state_dir)
    if not pid:
        print(f"no cluster running for {args.state_dir}", file=sys.stderr)
        return 1
    done = args.state_dir / RESTART_DONE
    done.unlink(missing_ok=True)
    (args.state_dir / RESTART_REQUEST).write_text(json.dumps({"down": args.down, "etcd": args.etcd}))
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + args.down + 180
    while not done.exists():
        if time.monotonic() > deadline or not running_pid(args.state_dir):
            print(f"the API server did not come back; see {args.state_dir / 'cluster.log'}", file=sys.stderr)
            return 1
        time.sleep(0.2)
    print(f"API server restarted; outage {done.read_text()}s", file=sys.stderr)
    return 0


def status(args: argparse.Namespace) -> int:
    if running_pid(args.state_dir) and (args.state_dir / "ready").exists():
        print(exports(args.state_dir), end="")
        return 0
    print(f"no cluster running for {args.state_dir}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devcluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "serve", "down", "status", "restart-apiserver"):
        p = sub.add_parser(name)
        p.add_argument("--state-dir", type=Path, default=DEFAULT_DIR,
                       help=f"folder for everything the cluster writes (default {DEFAULT_DIR})")
        if name in ("up", "serve"):
            p.add_argument("--kwok-nodes", type=int, default=4, help="simulated nodes (0: none)")
            p.add_argument("--gpus", type=int, default=0,
                           help="nvidia.com/gpu capacity of the process node")
            p.add_argument("--operator", action="store_true",
                           help="also run the SPMDJob operator (log: <state>/operator.log)")
            p.add_argument("--kueue", action="store_true",
                           help="also run Kueue (log: <state>/kueue/kueue.log)")
            p.add_argument("--real-nodes", type=int, default=0,
                           help="real kubelet nodes running containers (devcluster/realnode.py)")
            p.add_argument("--timeout", type=float, default=600, help="seconds to wait for up")
        if name == "restart-apiserver":
            p.add_argument("--down", type=float, default=0.0, help="seconds to keep it down")
            p.add_argument("--etcd", action="store_true", help="restart etcd too (its data is kept)")
    args = parser.parse_args(argv)
    args.state_dir = args.state_dir.resolve()
    return {"up": up, "serve": serve, "down": down, "status": status,
            "restart-apiserver": restart_apiserver}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
