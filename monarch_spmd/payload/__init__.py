"""What ships into every pod: the env contract, the worker, and the names they share.

Where it sits: the bottom of the project. Everything in this subpackage imports only the
standard library and its siblings (relative imports), because the SPMDJob operator copies every
``*.py`` file of this folder into a per-job ConfigMap and mounts it into pods whose image does not
contain the project (``/opt/monarch-spmd/payload``). The package boundary is the list of files
shipped: add a module here only if a pod needs it, and never import the rest of ``monarch_spmd``
from it (a unit test checks both).

Modules:
    contract: the torchrun environment as one pure function of mesh coordinates.
    names: the API group, the labels, the container name and the worker's input variables.
    worker: the process every pod (and every local rank) runs: inputs -> env -> the agent.
    agent: the worker as torchrun's agent: rounds of processes, restarted in place through a
        coordinator in rank 0's agent (docs/restart-in-place.md), the watchdog, the progress timeout.
    agentstore: torchrun's agent store, the TCPStore at MASTER_PORT that rank 0's agent hosts in a
        child process when asked (MONARCH_SPMD_AGENT_STORE; torchft needs it).
    link, procs, observe: a member's and a spare's connection to the coordinator; the agent's
        duties towards its processes (reaping, OOM kills); its local observer.
    rendezvous: the restart-in-place protocol: its messages, their checks, its constants.
    coordinator: the coordinator's pure state machine (rounds), with its parts: counting (what a
        restart is charged to, the one rule), fence (no round while a lost member's processes may
        run or the coordinator may be cut off), takeover (hot spares), elastic (who a round runs),
        capture (a hang's stacks across the gang), history (the events observers see).
    hub, server: the coordinator's connections without I/O (what the simulation drives), and its
        sockets.
    procgroup: a round's local processes: start together, stop together, rank-prefixed output.
    member: a member's side of a round as a pure state machine (the agent carries out its actions).
    follow: an observer's client of the coordinator's stream (the agent's, the runner's, the operator's).
    timer: torchrun's file-timer watchdog, served from the agent's loop.
    hangs: a hung round's Python stacks, taken before its ranks end (SIGABRT and faulthandler).
    stacks: reading those stacks, and the rule that names the rank that hangs the gang.
    failures: which failures are permanent (shared with monarch_spmd.policy).
"""
