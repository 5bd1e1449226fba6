"""Turns the current process into one pod container, then execs the container's command.

Part of the test cluster's node agent (devcluster/nodeagent.py), which runs it as
`ip netns exec <pod netns> python3 podexec.py <spec.json>` (or without `ip netns exec` for a
hostNetwork pod). `ip netns exec` has already joined the pod's network namespace, given the
process a private mount namespace and bind-mounted /etc/netns/<netns>/{hosts,resolv.conf} over
/etc. This script then, inside that private view only:

- gives the pod its own UTS namespace with the pod's hostname,
- bind-mounts each volume folder prepared by the agent at its mountPath (read-only if asked),
  then binds back the host folders the pod runs from ("keep") where a volume hid them,
- changes to the working directory and execs the command with exactly the pod's env.

It is standalone on purpose (standard library only, no project imports): the agent runs it with
the host interpreter before anything of the pod exists. Exit code 127 means the command could
not be started (the agent reports it as a StartError).

spec.json: {"hostname": str, "mounts": [{"source", "target", "readOnly"}], "env": {..},
"cwd": str, "argv": [..], "keep": [host folder, ..]}
"""

import ctypes
import json
import os
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_SLAVE = 1, 32, 4096, 16384, 1 << 19

libc = ctypes.CDLL(None, use_errno=True)


def check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str, target: str, flags: int) -> None:
    check(libc.mount(source.encode(), target.encode(), None, flags, None), f"mount {target}")


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    # A mount namespace of our own (harmless if `ip netns exec` already made one), whose mounts
    # never propagate back to the host.
    check(libc.unshare(CLONE_NEWNS | CLONE_NEWUTS), "unshare")
    mount("none", "/", MS_REC | MS_SLAVE)
    hostname = spec["hostname"].encode()
    check(libc.sethostname(hostname, len(hostname)), "sethostname")
    # Hold every source open before mounting any: a volume mounted over a parent folder (an
    # emptyDir at /tmp, say) would otherwise hide the sources that live beneath it.
    sources = [os.open(m["source"], os.O_PATH) for m in spec["mounts"]]
    keep = [(path, os.open(path, os.O_PATH)) for path in spec.get("keep", [])]
    for m, fd in zip(spec["mounts"], sources):
        target = m["target"]
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(target, exist_ok=True)
        elif not os.path.exists(target):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "a").close()
        mount(f"/proc/self/fd/{fd}", target, MS_BIND | MS_REC)
        if m.get("readOnly"):
            mount("none", target, MS_REMOUNT | MS_BIND | MS_RDONLY)
    # The pod runs from host folders (the repository, the interpreter): a volume mounted over one
    # of their parents hid them, so bind them back on top, inside this private view only.
    for path, fd in keep:
        if any(path.startswith(m["target"].rstrip("/") + "/")
               for m in spec["mounts"]):
            os.makedirs(path, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", path, MS_BIND | MS_REC)
    for fd in sources + [fd for _, fd in keep]:
        os.close(fd)
    os.makedirs(spec["cwd"], exist_ok=True)  # a runtime creates a missing workingDir
    os.chdir(spec["cwd"])
    os.execvpe(spec["argv"][0], spec["argv"], spec["env"])


if __name__ == "__main__":
    try:
        main()
    except OSError as err:
        print(f"podexec: cannot start the container: {err}", file=sys.stderr)
        sys.exit(127)
