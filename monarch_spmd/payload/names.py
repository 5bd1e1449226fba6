"""The names every part of the project agrees on: API group, labels, container, worker inputs.

Where it sits: in the payload (standard library only, shipped into pods), beside
:mod:`.contract`. The operator's children, the local runner, ``monarch-spmd logs`` and the worker
all take these names from here; ``docs/interfaces.md`` lists them for people.
"""

from __future__ import annotations

from typing import Final

# --- the SPMDJob API -------------------------------------------------------------------------
GROUP: Final = "spmd.monarch.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "SPMDJob"
PLURAL: Final = "spmdjobs"

# --- labels on every child of a job ----------------------------------------------------------
LABEL_PREFIX: Final = f"{GROUP}/"
#: On every child: the job's name. Pods are watched with this label as the server-side selector.
LABEL_JOB: Final = f"{LABEL_PREFIX}job"
#: On every child: the job's uid. Children are counted only when this and the controller owner
#: reference name the job, so a new job never mistakes an older namesake's pods for its own.
LABEL_JOB_UID: Final = f"{LABEL_PREFIX}job-uid"
#: On every pod: its global rank (the first rank of the pod in the PerHost layout).
LABEL_RANK: Final = f"{LABEL_PREFIX}rank"
#: On every pod and per-attempt Service: the gang attempt (restart count) it belongs to.
LABEL_RESTART: Final = f"{LABEL_PREFIX}restart"
#: On a PerHost pod: how many procs it runs (its log lines carry rank prefixes already).
LABEL_PROCS: Final = f"{LABEL_PREFIX}procs"
#: Followed by a mesh dimension's name: the pod's coordinate on that dimension.
COORD_LABEL_PREFIX: Final = f"{LABEL_PREFIX}coord-"

#: The pod template's container that becomes the proc's container (the others are sidecars).
TRAINER_CONTAINER: Final = "trainer"


def coord_label(dim: str) -> str:
    """The label key holding a pod's coordinate on mesh dimension ``dim``."""
    return f"{COORD_LABEL_PREFIX}{dim}"


# --- the worker's input variables (set by the operator on pods, by the runner on processes) ---
MESH_VAR: Final = "MONARCH_SPMD_MESH"
COORDS_VAR: Final = "MONARCH_SPMD_COORDS"
MASTER_ADDR_VAR: Final = "MONARCH_SPMD_MASTER_ADDR"
MASTER_PORT_VAR: Final = "MONARCH_SPMD_MASTER_PORT"
RESTART_COUNT_VAR: Final = "MONARCH_SPMD_RESTART_COUNT"
MAX_RESTARTS_VAR: Final = "MONARCH_SPMD_MAX_RESTARTS"
RUN_ID_VAR: Final = "MONARCH_SPMD_RUN_ID"
ROLE_NAME_VAR: Final = "MONARCH_SPMD_ROLE_NAME"
RENDEZVOUS_TIMEOUT_VAR: Final = "MONARCH_SPMD_RENDEZVOUS_TIMEOUT"
LOCAL_RANK_SCOPE_VAR: Final = "MONARCH_SPMD_LOCAL_RANK_SCOPE"
POD_LAYOUT_VAR: Final = "MONARCH_SPMD_POD_LAYOUT"
MODE_VAR: Final = "MONARCH_SPMD_MODE"
MONARCH_PORT_VAR: Final = "MONARCH_SPMD_MONARCH_PORT"
# Restart in place (docs/restart-in-place.md): the coordinator, the policy it decides with, hangs.
AGENT_PORT_VAR: Final = "MONARCH_SPMD_AGENT_PORT"
AGENT_ADDR_VAR: Final = "MONARCH_SPMD_AGENT_ADDR"
#: The attempt's proof of membership: every agent's and observer's hello carries it, and the
#: coordinator accepts no connection without it (docs/restart-in-place.md, "Trust and bounds").
AGENT_TOKEN_VAR: Final = "MONARCH_SPMD_AGENT_TOKEN"
#: A hot spare's index (docs/restart-in-place.md, "Hot spares"): the worker waits, connected to
#: the coordinator, to take a lost member's place; its pod's coordinates are the member's then.
SPARE_VAR: Final = "MONARCH_SPMD_SPARE"
DISRUPTIONS_VAR: Final = "MONARCH_SPMD_DISRUPTIONS"
PERMANENT_EXIT_CODES_VAR: Final = "MONARCH_SPMD_PERMANENT_EXIT_CODES"
RETRYABLE_EXIT_CODES_VAR: Final = "MONARCH_SPMD_RETRYABLE_EXIT_CODES"
PERMANENT_REASONS_VAR: Final = "MONARCH_SPMD_PERMANENT_REASONS"
BACKOFF_VAR: Final = "MONARCH_SPMD_BACKOFF_SECONDS"
MAX_BACKOFF_VAR: Final = "MONARCH_SPMD_MAX_BACKOFF_SECONDS"
BACKOFF_RESET_VAR: Final = "MONARCH_SPMD_BACKOFF_RESET_SECONDS"
JOIN_TIMEOUT_VAR: Final = "MONARCH_SPMD_JOIN_TIMEOUT"
MEMBER_FAILURE_LIMIT_VAR: Final = "MONARCH_SPMD_MEMBER_FAILURE_LIMIT"
#: An elastic gang (docs/restart-in-place.md, "Elastic sizes"): a round may start with this many
#: members (torchrun's --nnodes MIN), once the rest have not joined within MONARCH_SPMD_ELASTIC_WAIT.
MIN_MEMBERS_VAR: Final = "MONARCH_SPMD_MIN_MEMBERS"
ELASTIC_WAIT_VAR: Final = "MONARCH_SPMD_ELASTIC_WAIT"
PROGRESS_TIMEOUT_VAR: Final = "MONARCH_SPMD_PROGRESS_TIMEOUT"
STOP_GRACE_VAR: Final = "MONARCH_SPMD_STOP_GRACE"
#: spec.failureOutput: whether a failure carries the last lines of the rank's output (Tail) or not
#: (None: the termination message, the observer stream and status name the rank, code and reason only).
FAILURE_OUTPUT_VAR: Final = "MONARCH_SPMD_FAILURE_OUTPUT"
FAILURE_OUTPUT_TAIL: Final = "Tail"
FAILURE_OUTPUT_NONE: Final = "None"
FAILURE_OUTPUTS: Final = (FAILURE_OUTPUT_TAIL, FAILURE_OUTPUT_NONE)
# torchrun's --log-dir, --redirects and --tee (set by the local runner).
LOG_DIR_VAR: Final = "MONARCH_SPMD_LOG_DIR"
REDIRECTS_VAR: Final = "MONARCH_SPMD_REDIRECTS"
TEE_VAR: Final = "MONARCH_SPMD_TEE"
#: torchrun's agent store (payload/agentstore.py): member 0's agent hosts the TCPStore on
#: MASTER_PORT and the ranks see TORCHELASTIC_USE_AGENT_STORE=True (what torchft's Manager needs).
AGENT_STORE_VAR: Final = "MONARCH_SPMD_AGENT_STORE"
#: The coordinator's port in pods: torchrun's c10d rendezvous port (never MASTER_PORT, which rank
#: 0's TCPStore owns).
DEFAULT_AGENT_PORT: Final = 29400

#: ``spec.podLayout``: one pod (one worker) per proc, or per coordinate of every dimension but
#: the last (a "host"), whose worker starts that host's procs as local processes.
PER_PROC: Final = "PerProc"
PER_HOST: Final = "PerHost"
POD_LAYOUTS: Final = (PER_PROC, PER_HOST)
#: ``spec.mode``: run the training argv once (Program), or serve as a Monarch host (Monarch):
#: the worker runs Monarch's worker loop and a client attaches to it (monarch_spmd.kubernetes).
MODE_PROGRAM: Final = "Program"
MODE_MONARCH: Final = "Monarch"
MODES: Final = (MODE_PROGRAM, MODE_MONARCH)
#: The TCP port of a Monarch-mode pod's worker loop (Monarch's own default, as its MonarchMesh
#: pods use); the pod declares it as the container port named MONARCH_PORT_NAME.
DEFAULT_MONARCH_PORT: Final = 26600
MONARCH_PORT_NAME: Final = "monarch"
#: The prefix of every worker input; the operator owns them all but USER_SETTABLE_VARS.
RESERVED_PREFIX: Final = "MONARCH_SPMD_"
#: Worker inputs a user may set in the ``trainer`` container's env (the user's value wins).
USER_SETTABLE_VARS: Final = frozenset({ROLE_NAME_VAR, LOCAL_RANK_SCOPE_VAR})

# --- the worker's own exit codes -------------------------------------------------------------
#: Bad worker input: a missing or invalid variable, or an empty argv. Permanent.
EX_USAGE: Final = 64
#: Retryable by design: MASTER_ADDR never resolved, or the gang must be recreated because a
#: restart in place could not complete (docs/restart-in-place.md).
EX_TEMPFAIL: Final = 75
