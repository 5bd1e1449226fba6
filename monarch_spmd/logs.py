"""``monarch-spmd logs JOB``: the logs of every rank of an SPMDJob in one stream.

Where it sits: a command of the CLI (``monarch_spmd.cli`` dispatches ``monarch-spmd logs ...``
to :func:`main`), beside the local runner and above nothing else of the library; it talks to
Kubernetes through the ``kubernetes`` Python client, imported inside functions so that
``import monarch_spmd`` stays standard-library only (``pip install 'monarch-spmd[cli]'``).

::

    monarch-spmd logs JOB [-n NAMESPACE] [--rank R ...] [-f] [--restart N] [--tail N]
                          [--container NAME] [--kubeconfig PATH]

It reads the job, then finds its pods by the job's uid (the label ``spmd.monarch.dev/job-uid``
and the controller owner reference: never by name alone, so the pods a deleted namesake left
behind are never shown), keeps those of one gang attempt (``spmd.monarch.dev/restart``; the job's current one, ``status.restarts``, unless
``--restart`` names another) and of the ranks asked for (``--rank``, repeatable, ``0,2`` and
``4-7`` allowed), and prints every line of the ``trainer`` container as ``[rank R] line``.
Without ``--follow`` each rank's log is printed whole, in rank order; with it, it waits for the
pods to exist, then one thread per pod streams its log and lines are printed as they arrive
(whole lines only, never mixed), until every container has ended or Ctrl-C. The log of a
failed job ends, on standard error, with the per-rank table of ``monarch-spmd status JOB`` and a
last line naming the rank that failed first (:func:`monarch_spmd.status.rank_table`).

Short flags follow kubectl (``-n``, ``-f``); the rank has no short flag: ``-r`` is torchrun's
``--redirects`` in ``monarch-spmd run``, so ``-r`` here is refused with a message naming ``--rank``.

The pure parts (argument parsing, pod selection, line splitting and prefixing) are functions and
a small class with plain values in and out; the unit tests exercise them without a cluster.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, Any, Final

from . import kubeconfig as kubeconfig_rule
from . import status as status_view
from .payload.names import GROUP, PLURAL, VERSION
from .payload.names import LABEL_JOB as JOB_LABEL
from .payload.names import LABEL_JOB_UID as JOB_UID_LABEL
from .payload.names import LABEL_PROCS as PROCS_LABEL
from .payload.names import LABEL_RANK as RANK_LABEL
from .payload.names import LABEL_RESTART as RESTART_LABEL
from .payload.names import TRAINER_CONTAINER as CONTAINER

#: Seconds between looks for pods that do not exist, or containers that have not started, yet.
POLL_SECONDS: Final = 1.0
#: After following every rank to its end: how long to wait for the operator to say how the job
#: ended (its phase), for the failure summary.
SUMMARY_WAIT_SECONDS: Final = 15.0

_PROG: Final = "monarch-spmd logs"


class LogsError(Exception):
    """A problem the user can act on (job not found, no pods yet, ...); the message says which."""


class NoPodsYet(LogsError):
    """The job exists but has no pods (yet); follow mode waits for them."""


# --------------------------------------------------------------------------- pure parts


def parse_ranks(text: str) -> list[int]:
    """Parses ``"3"``, ``"0,2"`` or ``"4-7"`` (and mixes such as ``"0,4-5"``) into ranks.

    Raises:
        argparse.ArgumentTypeError: for anything else, naming what would be valid.
    """
    ranks: list[int] = []
    for part in text.split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        try:
            if dash:
                first, last = int(low), int(high)
                if first > last:
                    raise ValueError
                ranks.extend(range(first, last + 1))
            else:
                ranks.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a rank list; expected e.g. 3, 0,2 or 4-7"
            ) from None
    if any(r < 0 for r in ranks):
        raise argparse.ArgumentTypeError(f"{text!r}: ranks are integers of at least 0")
    return ranks


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer of at least 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``monarch-spmd logs``."""
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="Print the logs of every rank of an SPMDJob in one stream, each line prefixed "
        "'[rank R]'.",
    )
    parser.add_argument("job", metavar="JOB", help="the SPMDJob's name")
    parser.add_argument(
        "-n", "--namespace", help="the job's namespace (default: the kubeconfig context's, else 'default')"
    )
    parser.add_argument(
        "--rank",
        dest="ranks",
        action="append",
        type=parse_ranks,
        metavar="R",
        help="only these ranks; repeatable, and '0,2' or '4-7' allowed (default: all)",
    )
    parser.add_argument(
        "-f", "--follow", action="store_true", help="stream the logs until every rank's container ends"
    )
    parser.add_argument(
        "--restart",
        type=_non_negative,
        metavar="N",
        help="the gang attempt to show, 0 first (default: the current one, status.restarts)",
    )
    parser.add_argument("--tail", type=_non_negative, metavar="N", help="only the last N lines of each rank")
    parser.add_argument("--container", default=CONTAINER, help=f"container name (default: {CONTAINER})")
    parser.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parses the command line; ``ranks`` becomes a sorted list of unique ranks, or None for all."""
    parser = build_parser()
    for arg in argv:
        if arg == "--":
            break
        if arg == "-r" or (arg.startswith("-r") and not arg.startswith("--")):
            parser.error(f"{arg}: not an option of monarch-spmd logs (-r is torchrun's --redirects in monarch-spmd run); "
                         "give --rank R")
    opts = parser.parse_args(list(argv))
    if opts.ranks is not None:
        opts.ranks = sorted({r for group in opts.ranks for r in group})
    return opts


def rank_prefix(rank: int) -> str:
    """The prefix of every line of ``rank``'s log."""
    return f"[rank {rank}] "


def current_restart(job: Mapping[str, Any]) -> int:
    """The job's current gang attempt: ``status.restarts`` (0 before the first restart)."""
    status = job.get("status") or {}
    restarts = status.get("restarts")
    return restarts if isinstance(restarts, int) and not isinstance(restarts, bool) and restarts >= 0 else 0


def _label_int(pod: Mapping[str, Any], label: str) -> int | None:
    raw = ((pod.get("metadata") or {}).get("labels") or {}).get(label)
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def pod_ranks(pod: Mapping[str, Any]) -> range:
    """The ranks a pod runs: its rank label, and (PerHost) the next ``procs`` - 1 ranks."""
    first = _label_int(pod, RANK_LABEL) or 0
    return range(first, first + max(1, _label_int(pod, PROCS_LABEL) or 1))


def select_pods(
    pods: Iterable[Mapping[str, Any]], job: str, uid: str, restart: int, ranks: Sequence[int] | None = None
) -> list[tuple[int, Mapping[str, Any]]]:
    """The ``(first rank, pod)`` pairs of one gang attempt of the job ``uid``, in rank order.

    A PerHost pod runs several ranks (:func:`pod_ranks`); it is kept when any of them is asked for.

    Args:
        pods: pods as plain dicts (``metadata.name``, ``metadata.labels``), e.g. a pod list's items.
        job: the SPMDJob's name, for messages.
        uid: the SPMDJob's uid; pods of other jobs, a deleted namesake's included, are ignored
            (:func:`monarch_spmd.status.owned_by`).
        restart: the gang attempt (``spmd.monarch.dev/restart``) to keep.
        ranks: the ranks to keep; None keeps all.

    Raises:
        LogsError: when no pod of the job has that attempt (saying which attempts exist), or
            when some asked-for ranks have no pod (saying which ranks exist).
    """
    mine = [p for p in pods if status_view.owned_by(p, uid)]
    attempts = sorted({a for a in (_label_int(p, RESTART_LABEL) for p in mine) if a is not None})
    chosen = [p for p in mine if _label_int(p, RESTART_LABEL) == restart]
    if not chosen:
        if not attempts:
            raise NoPodsYet(f"spmdjob {job} has no pods yet")
        raise LogsError(
            f"spmdjob {job} has no pods of restart {restart}; pods exist for restart(s) "
            f"{', '.join(map(str, attempts))} (choose one with --restart)"
        )
    by_rank: dict[int, Mapping[str, Any]] = {}
    for pod in chosen:
        rank = _label_int(pod, RANK_LABEL)
        if rank is not None:
            by_rank[rank] = pod
    if ranks is not None:
        have = sorted({r for pod in by_rank.values() for r in pod_ranks(pod)})
        missing = sorted(set(ranks) - set(have))
        if missing:
            raise LogsError(
                f"spmdjob {job} restart {restart} has no pod for rank(s) {', '.join(map(str, missing))}; "
                f"it has rank(s) {_ranges(have)}"
            )
        wanted = set(ranks)
        by_rank = {r: p for r, p in by_rank.items() if wanted.intersection(pod_ranks(p))}
    return sorted(by_rank.items(), key=lambda item: item[0])


def _ranges(values: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    out: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ", ".join(out) or "none"


class LineSplitter:
    """Turns a stream of byte chunks into whole prefixed lines.

    A chunk may end in the middle of a line (or of a UTF-8 character); the rest is kept until the
    next chunk or :meth:`flush`. Undecodable bytes become U+FFFD rather than errors. With
    ``keep``, only the lines it accepts are returned.
    """

    def __init__(self, prefix: str, keep: Callable[[str], bool] | None = None) -> None:
        self.prefix = prefix
        self.keep = keep
        self._pending = b""

    def feed(self, chunk: bytes) -> list[str]:
        """The whole lines completed by ``chunk``, each prefixed, without their line ends."""
        data = self._pending + chunk
        *lines, self._pending = data.split(b"\n")
        return self._format(lines)

    def flush(self) -> list[str]:
        """The last, unterminated line, if any."""
        rest, self._pending = self._pending, b""
        return self._format([rest]) if rest else []

    def _format(self, lines: list[bytes]) -> list[str]:
        text = [line.rstrip(b"\r").decode("utf-8", errors="replace") for line in lines]
        return [self.prefix + t for t in text if self.keep is None or self.keep(t)]


def splitter_for(pod: Mapping[str, Any], ranks: Sequence[int] | None) -> LineSplitter:
    """How a pod's lines are shown: prefixed with its rank; a PerHost pod's lines carry their rank
    prefixes already (its worker writes them) and, with ``ranks``, only those ranks' lines stay."""
    own = pod_ranks(pod)
    if _label_int(pod, PROCS_LABEL) is None:  # PerProc: the pod's lines are its one rank's own
        return LineSplitter(rank_prefix(own[0]))
    if ranks is None:
        return LineSplitter("")
    prefixes = tuple(rank_prefix(r) for r in ranks if r in own)
    return LineSplitter("", keep=lambda line: line.startswith(prefixes))


def prefix_lines(prefix: str, text: bytes | str, keep: Callable[[str], bool] | None = None) -> list[str]:
    """Every line of a whole log, prefixed (a final line without a line end included)."""
    splitter = LineSplitter(prefix, keep)
    data = text.encode("utf-8") if isinstance(text, str) else text
    return splitter.feed(data) + splitter.flush()


class _Output:
    """Whole lines to one stream from many threads."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def lines(self, lines: Iterable[str]) -> None:
        with self._lock:
            for line in lines:
                self._stream.write(line + "\n")
            self._stream.flush()


# --------------------------------------------------------------------------- Kubernetes side


def _load_config(kubeconfig: str | None) -> tuple[Any, str]:
    """Loads the client configuration; returns ``(ApiClient, default namespace)``."""
    try:
        return kubeconfig_rule.load(kubeconfig)
    except kubeconfig_rule.ConfigError as err:
        raise LogsError(str(err)) from None


def _api_error(err: Any, what: str) -> LogsError:
    if err.status in (401, 403):
        return LogsError(f"{what}: not allowed ({err.status} {err.reason}); check your credentials and RBAC")
    return LogsError(f"{what}: {err.status} {err.reason}")


def _get_job(api_client: Any, namespace: str, job: str) -> dict[str, Any]:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        return client.CustomObjectsApi(api_client).get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, job
        )
    except ApiException as err:
        if err.status == 404:
            raise LogsError(
                f"spmdjob {job} not found in namespace {namespace} (kubectl get spmdjobs -n {namespace})"
            ) from None
        raise _api_error(err, f"reading spmdjob {job}") from None


def _list_pods(api_client: Any, namespace: str, job: str, uid: str) -> list[dict[str, Any]]:
    """The pods labelled with the job's uid (:func:`select_pods` checks their owner too)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        resp = client.CoreV1Api(api_client).list_namespaced_pod(
            namespace, label_selector=f"{JOB_UID_LABEL}={uid}", _preload_content=False
        )
    except ApiException as err:
        raise _api_error(err, f"listing the pods of spmdjob {job}") from None
    return list(json.loads(resp.data).get("items") or [])


def _pod_name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name"))


def check_container(pod: Mapping[str, Any], container: str) -> None:
    """Raises LogsError unless ``pod`` has a container named ``container`` (naming those it has)."""
    spec = pod.get("spec") or {}
    have = [c.get("name") for key in ("containers", "initContainers") for c in spec.get(key) or []]
    if container not in have:
        raise LogsError(
            f"pod {_pod_name(pod)} has no container {container!r}; its containers are {', '.join(map(str, have))}"
        )


#: What the API server says (HTTP 400) while a container has no log yet, as opposed to a bad request.
_NOT_YET: Final = ("waiting to start", "ContainerCreating", "PodInitializing", "is not available")


def _not_started(err: Any) -> bool:
    return err.status == 400 and any(text in str(err.body or "") for text in _NOT_YET)


def _read_log(api_client: Any, namespace: str, pod: str, container: str, tail: int | None) -> bytes | None:
    """A pod's whole log, or None when its container has not started (or the pod is gone)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    kwargs: dict[str, Any] = {"container": container, "_preload_content": False}
    if tail is not None:
        kwargs["tail_lines"] = tail
    try:
        return client.CoreV1Api(api_client).read_namespaced_pod_log(pod, namespace, **kwargs).data
    except ApiException as err:
        if err.status == 404 or _not_started(err):
            return None
        raise _api_error(err, f"reading the log of pod {pod}") from None


def _follow_pod(
    api_client: Any,
    namespace: str,
    pod: str,
    container: str,
    rank: int,
    tail: int | None,
    out: _Output,
    errors: list[str],
    splitter: LineSplitter,
) -> None:
    """Streams one pod's log to ``out`` until its container ends (waits while it has not started)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api = client.CoreV1Api(api_client)
    kwargs: dict[str, Any] = {"container": container, "follow": True, "_preload_content": False}
    if tail is not None:
        kwargs["tail_lines"] = tail
    while True:
        try:
            resp = api.read_namespaced_pod_log(pod, namespace, **kwargs)
            break
        except ApiException as err:
            if _not_started(err):  # ContainerCreating / Pending: no log to stream yet
                time.sleep(POLL_SECONDS)
                continue
            if err.status == 404:
                errors.append(f"rank {rank}: pod {pod} was deleted")
                return
            errors.append(str(_api_error(err, f"rank {rank}: streaming the log of pod {pod}")))
            return
        except Exception as err:  # noqa: BLE001 - a thread must report, not die silently
            errors.append(f"rank {rank}: streaming the log of pod {pod}: {err}")
            return
    try:
        for chunk in resp.stream(4096, decode_content=True):
            out.lines(splitter.feed(chunk))
    except Exception as err:  # noqa: BLE001
        errors.append(f"rank {rank}: the log stream of pod {pod} broke: {err}")
    finally:
        out.lines(splitter.flush())
        resp.release_conn()


def run(opts: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
    """Prints the logs the parsed options ask for; returns the exit code.

    Raises:
        LogsError: job not found, no pods (without --follow), ranks or restart that do not exist.
    """
    api_client, default_ns = _load_config(opts.kubeconfig)
    namespace = opts.namespace or default_ns
    job = _get_job(api_client, namespace, opts.job)
    uid = str((job.get("metadata") or {}).get("uid") or "")
    restart = opts.restart if opts.restart is not None else current_restart(job)

    waited = False
    while True:
        try:
            pods = _list_pods(api_client, namespace, opts.job, uid)
            selected = select_pods(pods, opts.job, uid, restart, opts.ranks)
            break
        except NoPodsYet:
            if not opts.follow:
                raise
            if not waited:
                stderr.write(f"{_PROG}: spmdjob {opts.job} has no pods yet; waiting for them\n")
                stderr.flush()
                waited = True
            time.sleep(POLL_SECONDS)

    for _, pod in selected:
        check_container(pod, opts.container)
    out = _Output(stdout)
    if not opts.follow:
        for rank, pod in selected:
            data = _read_log(api_client, namespace, _pod_name(pod), opts.container, opts.tail)
            if data is None:
                phase = (pod.get("status") or {}).get("phase", "unknown")
                stderr.write(f"{_PROG}: rank {rank}: pod {_pod_name(pod)} has no log yet (phase {phase})\n")
                continue
            splitter = splitter_for(pod, opts.ranks)
            out.lines(splitter.feed(data) + splitter.flush())
        summarize(job, pods, stderr)
        return 0

    errors: list[str] = []
    threads = [
        threading.Thread(
            target=_follow_pod,
            args=(api_client, namespace, _pod_name(pod), opts.container, rank, opts.tail, out, errors,
                  splitter_for(pod, opts.ranks)),
            name=f"logs-rank-{rank}",
            daemon=True,
        )
        for rank, pod in selected
    ]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.5)  # a timed join keeps Ctrl-C deliverable
    for message in errors:
        stderr.write(f"{_PROG}: {message}\n")
    pods = _list_pods(api_client, namespace, opts.job, uid)
    followed = {_pod_name(pod) for _, pod in selected}
    failed = any(_pod_name(p) in followed and _failed(p) for p in pods)
    ended = _ended(api_client, namespace, opts.job, uid, SUMMARY_WAIT_SECONDS if failed else 0.0)
    if ended is not None:
        summarize(ended, _list_pods(api_client, namespace, opts.job, uid), stderr)
    return 1 if errors else 0


def _failed(pod: Mapping[str, Any]) -> bool:
    """Whether a pod's trainer container ended with a non-zero exit code."""
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        ended = (c.get("state") or {}).get("terminated")
        if c.get("name") == CONTAINER and ended and ended.get("exitCode"):
            return True
    return False


def summarize(job: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], stderr: IO[str]) -> None:
    """For a failed job: the per-rank table and the line naming the rank that failed first."""
    if (job.get("status") or {}).get("phase") != "Failed":
        return
    stderr.write("\n".join(status_view.rank_table(job, pods)) + "\n")
    stderr.flush()


def _ended(api_client: Any, namespace: str, name: str, uid: str, wait: float) -> dict[str, Any] | None:
    """The job once the operator has said how its followed attempt ended (any phase but Running),
    waiting up to ``wait`` seconds; None if it is gone or another job took its name."""
    deadline = time.monotonic() + wait
    while True:
        try:
            job = _get_job(api_client, namespace, name)
        except LogsError:
            return None
        if (job.get("metadata") or {}).get("uid") != uid:
            return None
        if (job.get("status") or {}).get("phase") != "Running" or time.monotonic() > deadline:
            return job
        time.sleep(POLL_SECONDS)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``monarch-spmd logs`` (``argv`` without the ``logs`` word); returns the exit code."""
    return kubeconfig_rule.run_command(_PROG, sys.argv[1:] if argv is None else argv, parse_args, run, LogsError)


if __name__ == "__main__":
    sys.exit(main())
