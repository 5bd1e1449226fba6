"""The pods of an SPMDJob before they exist: ``monarch-spmd pods`` (and ``manifest --pods``).

Where it sits: a command of the CLI (:mod:`monarch_spmd.cli` dispatches ``monarch-spmd pods ...``
to :func:`main`), beside :mod:`monarch_spmd.status` and :mod:`monarch_spmd.logs`. It builds the
pods with the operator's own pod builder (:func:`spmd_operator.builders.build_pod`, the function
the operator calls to create them) and computes each proc's torchrun variables with the worker's
own code (:func:`monarch_spmd.payload.worker.build_env`), so what it shows cannot drift from what
the operator creates and the worker sets. It imports the operator's package (shipped in the same
distribution) and PyYAML inside functions, so that ``import monarch_spmd`` stays standard-library
only; the server dry run needs the ``kubernetes`` client (``pip install 'monarch-spmd[cli]'``).

::

    monarch-spmd pods -f job.yaml|- [-n NAMESPACE] [-o yaml|json|table]
    monarch-spmd pods -f job.yaml --dry-run=server [-n NAMESPACE] [--kubeconfig PATH]
    monarch-spmd manifest ... --pods -- torchrun ...

With ``spec.spares`` the job's hot spares are shown too, after the gang's pods: real pods, built
as the operator builds them (:func:`spmd_operator.builders.build_spare_pod`: like pod 1, with the
same resources and GPUs, labelled ``spmd.monarch.dev/spare`` instead of a rank), so what a job
holds is every pod shown, and the totals count them. A spare has no rank until it takes a lost
pod's place.

What a pod carries that the manifest does not say: the trainer's command (the worker, then
``spec.args``), the MONARCH_SPMD_* inputs from which the worker computes RANK, LOCAL_RANK,
MASTER_ADDR ... (shown per proc), the downward-API variables, the ``nvidia.com/gpu`` limit
(``gpusPerProc`` times the pod's procs), the memory-backed ``/dev/shm``, the worker's read-only
ConfigMap volume, the labels (job, uid, rank, attempt, one per mesh coordinate), the owner
reference, the coordinator's port with restart in place, and the gang scheduler's name and group.
The template's own fields (tolerations, node selectors, requests ...) are merged in as the
operator merges them.

Until the job exists two values are placeholders: its uid (:data:`PLACEHOLDER_UID`), which the
API server assigns and which is part of every pod's name, labels, MASTER_ADDR
(``<job>-<id>-m<attempt>.<namespace>.svc``, ``<id>`` five hex digits of the uid) and
TORCHELASTIC_RUN_ID; and the attempt's agent token (:data:`PLACEHOLDER_TOKEN`), a random secret
the operator makes per attempt. The attempt shown is the first (restart 0). With
``scheduling.provider: kueue`` the admitted ResourceFlavors' node labels and tolerations are added
at admission, which only the cluster knows.

``--dry-run=server`` POSTs every pod to the namespace with ``dryRun=All`` and field validation
Strict (as the operator creates them), with the kubeconfig's credentials
(:mod:`monarch_spmd.kubeconfig`, as ``logs`` and ``status`` use), and prints what the API server answered: accepted, or refused with its causes,
each pod field also named as the SPMDJob field it came from (:func:`spmd_operator.podpaths.translate`,
what the operator reports on a refusal). Nothing is created. The pods are sent without their owner
reference: the job does not exist yet, and setting one on a pod is the operator's permission, not
the user's.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Final

from . import kubeconfig as kubeconfig_rule
from . import policy, quantity, spec
from .payload import names, worker

#: The uid shown until the API server assigns the job's own.
PLACEHOLDER_UID: Final = "00000000-0000-0000-0000-000000000000"
#: The agent token shown in place of the random one the operator makes per attempt (a valid
#: MONARCH_SPMD_AGENT_TOKEN: 16 URL-safe characters).
PLACEHOLDER_TOKEN: Final = "made-per-attempt"
#: Output formats.
FORMATS: Final = ("yaml", "json", "table")
#: The torchrun variables that differ between the procs of a job (the others are the same for all).
PER_PROC: Final = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK")

_PROG: Final = "monarch-spmd pods"


class PodsError(Exception):
    """The manifest cannot be shown or checked; the message names the field or what to do."""


@dataclass(frozen=True)
class PodView:
    """One pod as the operator creates it, and what its worker gives each of its procs.

    Attributes:
        index: the pod's index in the gang (its first rank is ``index * procs``); a hot spare's is
            that of the pod it is built as (1).
        pod: the Pod object, exactly as :func:`spmd_operator.builders.build_pod` (a hot spare:
            :func:`~spmd_operator.builders.build_spare_pod`) returns it.
        procs: the torchrun variables of each proc the pod runs, in local-rank order, as the worker
            computes them from the pod's env (empty in Monarch mode: the client sets them; empty
            for a hot spare, which has no rank until it takes a lost pod's place).
        spare: the hot spare's number (``<job>-<id>-r<attempt>-s<spare>``), None for a pod of the gang.
    """

    index: int
    pod: dict[str, Any]
    procs: tuple[dict[str, str], ...]
    spare: int | None = None

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def kind(self) -> str:
        """``member`` (a pod of the gang) or ``spare`` (a hot spare)."""
        return "member" if self.spare is None else "spare"


@dataclass(frozen=True)
class JobPods:
    """An SPMDJob's first attempt, pod by pod.

    Attributes:
        name, namespace: the job's.
        namespace_given: the namespace came from the manifest or the command line (else
            ``default`` was assumed).
        job: the operator's identity of the job (the uid a placeholder).
        spec: the parsed spec.
        pods: one :class:`PodView` per pod the attempt starts with: the gang's in index order,
            then its hot spares (spec.spares) in number order.
    """

    name: str
    namespace: str
    namespace_given: bool
    job: Any
    spec: spec.JobSpec
    pods: tuple[PodView, ...]

    @property
    def members(self) -> tuple[PodView, ...]:
        """The gang's pods."""
        return tuple(v for v in self.pods if v.spare is None)

    @property
    def spares(self) -> tuple[PodView, ...]:
        """The hot spares."""
        return tuple(v for v in self.pods if v.spare is not None)


def _operator() -> tuple[Any, Any, Any]:
    """The operator's ``builders``, ``names`` and ``podpaths`` modules."""
    try:
        from spmd_operator import builders, podpaths
        from spmd_operator import names as operator_names
    except ImportError as e:  # pragma: no cover - the package ships with the library
        raise PodsError(f"the operator's package (spmd_operator) is not importable ({e}); reinstall "
                        "monarch-spmd") from None
    return builders, operator_names, podpaths


def trainer(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod's trainer container."""
    return next(c for c in pod["spec"]["containers"] if c.get("name") == names.TRAINER_CONTAINER)


def proc_envs(pod: Mapping[str, Any]) -> tuple[dict[str, str], ...]:
    """The torchrun variables of every proc of ``pod``, computed by the worker's own functions
    from the pod's env (:func:`worker.read_inputs`, :func:`worker.build_env`); the downward-API
    variables (POD_IP ...) are the pod's own and are left out."""
    env = {e["name"]: str(e["value"]) for e in trainer(pod).get("env") or [] if "value" in e}
    inputs = worker.read_inputs(env)
    if inputs.mode == names.MODE_MONARCH:
        return ()
    base = worker.program_env(env)
    return tuple(worker.build_env(inputs, base, local) for local in range(inputs.local_procs))


def build(doc: Mapping[str, Any], *, namespace: str | None = None, uid: str = PLACEHOLDER_UID,
          token: str = PLACEHOLDER_TOKEN) -> JobPods:
    """The pods of the first attempt of the SPMDJob ``doc``, as the operator creates them: the
    gang's, then its hot spares (spec.spares), which it creates with them.

    Args:
        doc: the SPMDJob manifest (what ``kubectl apply`` takes); checked as the API server
            checks it, ``spec.image`` required.
        namespace: the namespace (default: the manifest's, else ``default``); a manifest naming
            another is an error, as with ``kubectl apply -n``.
        uid: the job's uid (a placeholder until it exists).
        token: the attempt's agent token (a placeholder: the operator makes a random one).

    Raises:
        PodsError: the manifest is not valid (naming the field) or names another namespace.
    """
    builders, operator_names, _ = _operator()
    try:
        name, declared, parsed = spec.load_manifest(doc, require_image=True)
    except spec.SpecError as e:
        raise PodsError(f"the SPMDJob is not valid: {e}") from None
    written = (doc.get("metadata") or {}).get("namespace") if isinstance(doc.get("metadata"), Mapping) else None
    if namespace and written and namespace != written:
        raise PodsError(f"the namespace from the command line ({namespace}) and metadata.namespace ({written}) "
                        "differ; give one, or the same")
    ns = namespace or declared
    job = operator_names.JobRef(name=name, namespace=ns, uid=uid)
    attempt_token = token if policy.agent_port(parsed) is not None else None
    pods = []
    for index in range(policy.pods_per_attempt(parsed)):
        pod = builders.build_pod(job, parsed, index, 0, token=attempt_token)
        pods.append(PodView(index, pod, proc_envs(pod)))
    for number in range(parsed.spares):  # spares.tend creates spares 0..spares-1 with the first attempt
        pod = builders.build_spare_pod(job, parsed, number, 0, token=attempt_token)
        pods.append(PodView(1, pod, (), spare=number))
    return JobPods(name, ns, bool(namespace or written), job, parsed, tuple(pods))


# --- showing them ---------------------------------------------------------------------------------


def _ranks(view: PodView) -> str:
    ranks = [int(env["RANK"]) for env in view.procs]
    if not ranks:
        return "-"
    return str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}..{ranks[-1]}"


def _shared(view: PodView) -> dict[str, str]:
    """The torchrun variables every proc of the pod has alike."""
    if not view.procs:
        return {}
    first = view.procs[0]
    return {k: v for k, v in first.items() if k not in PER_PROC and all(p.get(k) == v for p in view.procs)}


def _amount(text: str) -> Any:
    """A resource value of the table as a number, or None when it is none ("-") or no quantity."""
    return quantity.parse(text) if text != "-" else None


def _show_total(total: Any, memory: bool) -> str:
    """A sum of quantities as Kubernetes writes one: ``768Gi``, ``96``, ``1500m``."""
    if memory:
        return quantity.show(total)
    if total.denominator == 1:
        return str(total.numerator)
    millis = total * 1000
    return f"{millis.numerator}m" if millis.denominator == 1 else str(float(total))


def totals(pods: JobPods) -> dict[str, str]:
    """The trainer containers' GPUs (their ``nvidia.com/gpu`` limits), CPU and memory requests,
    summed over every pod, hot spares included (they hold theirs as the gang's pods do); a
    resource that no pod names is left out."""
    out: dict[str, str] = {}
    for key, kind, resource, memory in (("gpus", "limits", policy.GPU_RESOURCE, False),
                                        ("cpu", "requests", "cpu", False),
                                        ("memory", "requests", "memory", True)):
        values = [_amount(_resource(trainer(v.pod), kind, resource)) for v in pods.pods]
        known = [v for v in values if v is not None]
        if known:
            out[key] = _show_total(sum(known), memory)
    return out


def summary(pods: JobPods) -> str:
    """One line: how many pods, of which hot spares, and what they hold in all."""
    spares = len(pods.spares)
    count = f"{len(pods.pods)} pod(s)"
    if spares:
        count += f" ({len(pods.members)} of the gang and {spares} hot spare(s))"
    held = totals(pods)
    parts = [f"{held['gpus']} {policy.GPU_RESOURCE}"] if "gpus" in held else []
    parts += [f"{k} {held[k]}" for k in ("cpu", "memory") if k in held]
    return f"{count}, holding {', '.join(parts)} in all." if parts else f"{count}."


def header(pods: JobPods) -> list[str]:
    """The comment lines above the pods: what they are and which values are placeholders."""
    s = pods.spec
    ns = pods.namespace
    if not pods.namespace_given:
        ns += " (none given: kubectl apply uses the context's namespace; give -n NAMESPACE)"
    lines = [f"The pods the operator creates for SPMDJob {pods.name}'s first attempt (restart 0),",
             "built by its own pod builder (spmd_operator.builders.build_pod).",
             f"Namespace {ns}.",
             f"{len(pods.members)} pod(s) of {policy.procs_per_pod(s)} proc(s) each, podLayout {s.pod_layout}."]
    if pods.spares:
        lines += [f"Then {len(pods.spares)} hot spare(s) (spec.spares), built as pod 1 is (build_spare_pod): real pods",
                  "holding the same resources, with no rank until one takes a lost pod's place."]
    lines += [summary(pods),
              f"Until the job exists its uid is a placeholder, {PLACEHOLDER_UID}: it is in the",
              "pods' names, labels, owner reference, TORCHELASTIC_RUN_ID and MASTER_ADDR",
              "(<job>-<id>-m<attempt>.<namespace>.svc, <id> five hex digits of the uid)."]
    if policy.agent_port(s) is not None:
        lines.append(f"So is the attempt's agent token, {PLACEHOLDER_TOKEN} (the operator makes a random one).")
    if s.scheduling_provider == spec.SCHEDULING_KUEUE:
        lines.append("Kueue adds the admitted ResourceFlavors' node labels and tolerations at admission.")
    return lines


def _proc_comments(view: PodView) -> list[str]:
    if view.spare is not None:
        return [f"hot spare {view.spare}: no rank until it takes a lost pod's place (its worker waits at the gang's "
                "coordinator); it then runs that pod's procs, with that pod's torchrun variables"]
    if not view.procs:
        return [f"pod {view.index}: Monarch mode: its procs get the torchrun variables from the client "
                "(setup_torch_elastic_env)"]
    shared = _shared(view)
    lines = [f"pod {view.index}: ranks {_ranks(view)}; the worker gives its procs (torchrun's variables):",
             "  every proc: " + " ".join(f"{k}={v}" for k, v in shared.items())]
    for env in view.procs:
        lines.append("  " + " ".join(f"{k}={env[k]}" for k in env if k not in shared))
    return lines


def render_yaml(pods: JobPods) -> str:
    """The pods as YAML documents, each preceded by comment lines with its procs' torchrun variables."""
    import yaml

    out = [f"# {line}\n" for line in header(pods)]
    for view in pods.pods:
        out.append("---\n")
        out.extend(f"# {line}\n" for line in _proc_comments(view))
        out.append(yaml.safe_dump(view.pod, sort_keys=False, default_flow_style=False))
    return "".join(out)


def render_json(pods: JobPods) -> str:
    """The pods as a ``v1`` List, hot spares included (each labelled ``spmd.monarch.dev/spare``)."""
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [v.pod for v in pods.pods]}, indent=2) + "\n"


def _resource(container: Mapping[str, Any], kind: str, key: str) -> str:
    return str(((container.get("resources") or {}).get(kind) or {}).get(key, "-"))


def table_rows(pods: JobPods) -> list[list[str]]:
    """A header, one row per pod (KIND ``member`` or ``spare``: what it holds and where its procs
    meet), and a TOTAL row of every pod's GPUs, CPU and memory, spares included."""
    rows = [["POD", "KIND", "RANKS", "GPUS", "CPU", "MEMORY", "SHM", "TOLERATIONS", "MASTER"]]
    for view in pods.pods:
        c = trainer(view.pod)
        shm = next((v["emptyDir"].get("sizeLimit", "no limit") for v in view.pod["spec"].get("volumes") or []
                    if (v.get("emptyDir") or {}).get("medium") == "Memory"), "-")
        tolerations = ",".join(str(t.get("key", "*")) for t in view.pod["spec"].get("tolerations") or []) or "-"
        master = (f"{view.procs[0]['MASTER_ADDR']}:{view.procs[0]['MASTER_PORT']}" if view.procs else "-")
        rows.append([view.name, view.kind, _ranks(view), _resource(c, "limits", policy.GPU_RESOURCE),
                     _resource(c, "requests", "cpu"), _resource(c, "requests", "memory"), str(shm), tolerations,
                     master])
    held = totals(pods)
    rows.append(["TOTAL", f"{len(pods.pods)} pods", "", held.get("gpus", "-"), held.get("cpu", "-"),
                 held.get("memory", "-"), "", "", ""])
    return rows


def render_table(pods: JobPods) -> str:
    """One line per pod, then the totals."""
    rows = table_rows(pods)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "".join("   ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() + "\n" for r in rows)


def render(pods: JobPods, output: str = "yaml") -> str:
    """The pods in ``output`` (:data:`FORMATS`)."""
    if output == "json":
        return render_json(pods)
    if output == "table":
        return render_table(pods)
    return render_yaml(pods)


# --- the server dry run ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """The API server's answer to one pod's dry-run create.

    Attributes:
        pod: the pod's name.
        accepted: the server would create it.
        status: the HTTP status (201 when accepted).
        message: the server's message (its Status ``message``), "" when accepted.
        causes: ``(pod field, job field or None, message)`` of each cause the server gave.
        in_job_terms: the message with each pod field it names replaced by the SPMDJob field it
            came from (what the operator reports on a refusal), "" when that changes nothing.
    """

    pod: str
    accepted: bool
    status: int
    message: str = ""
    causes: tuple[tuple[str, str | None, str], ...] = ()
    in_job_terms: str = ""


def dry_run_body(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod as the dry run sends it: without the owner reference (see the module docstring)."""
    body = copy.deepcopy(dict(pod))
    body["metadata"].pop("ownerReferences", None)
    return body


def answer_of(pods: JobPods, view: PodView, status: int, text: str) -> Answer:
    """An :class:`Answer` from the server's reply (its Status object as JSON text, on a refusal)."""
    if 200 <= status < 300:
        return Answer(view.name, True, status)
    _, _, podpaths = _operator()
    try:
        body = json.loads(text)
    except ValueError:
        body = {}
    if not isinstance(body, Mapping):
        body = {}
    message = str(body.get("message") or text or f"HTTP {status}")
    causes = []
    for cause in (body.get("details") or {}).get("causes") or []:
        field = str(cause.get("field") or "")
        source = None
        if field:
            try:
                source = podpaths.job_path(pods.job, pods.spec, field, view.index, 0)
            except (ValueError, KeyError, IndexError, TypeError):
                source = None
        causes.append((field, source, str(cause.get("message") or cause.get("reason") or "")))
    return Answer(view.name, False, status, message, tuple(causes), _in_job_terms(pods, view, message))


def _in_job_terms(pods: JobPods, view: PodView, message: str) -> str:
    """The refusal as the operator words it for the job (its strict-decoding rewrite, then
    :func:`spmd_operator.podpaths.translate`), or ""."""
    _, _, podpaths = _operator()
    text = podpaths.strict_message(message)
    try:
        translated = podpaths.translate(pods.job, pods.spec, text, view.index, 0)
    except (ValueError, KeyError, IndexError, TypeError):
        return ""
    return translated if translated not in (message, text) else ""


def post(api_client: Any, path: str, query: Sequence[tuple[str, str]], body: Mapping[str, Any]) -> tuple[int, str]:
    """POSTs ``body`` as it is to ``path``; returns the HTTP status and the reply's text.

    The typed ``CoreV1Api.create_namespaced_pod`` is not used: recent clients check the body
    against their Pod model and refuse a field they do not know before anything is sent, while
    the point here is what the API server answers.
    """
    from kubernetes.client.rest import ApiException

    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    try:
        if hasattr(api_client, "param_serialize"):  # the pydantic-based clients
            method, url, header_params, data, _ = api_client.param_serialize(
                "POST", path, query_params=list(query), header_params=headers, body=dict(body),
                auth_settings=["BearerToken"])
            reply = api_client.call_api(method, url, header_params=header_params, body=data)
            reply.read()
            text = reply.data.decode("utf-8", "replace") if isinstance(reply.data, bytes) else str(reply.data or "")
            return int(reply.status), text
        reply = api_client.call_api(path, "POST", query_params=list(query), header_params=headers, body=dict(body),
                                    auth_settings=["BearerToken"], _preload_content=False,
                                    _return_http_data_only=True)
        return int(reply.status), reply.data.decode("utf-8", "replace")
    except ApiException as e:
        body_text = e.body.decode("utf-8", "replace") if isinstance(e.body, bytes) else str(e.body or e.reason or "")
        return int(e.status or 0), body_text


def dry_run(pods: JobPods, api_client: Any) -> list[Answer]:
    """POSTs every pod to ``pods.namespace`` with ``dryRun=All`` (field validation Strict); the
    API server checks and admits it as it would the operator's create, and stores nothing."""
    path = f"/api/v1/namespaces/{pods.namespace}/pods"
    query = [("dryRun", "All"), ("fieldValidation", "Strict")]
    answers = []
    for view in pods.pods:
        status, text = post(api_client, path, query, dry_run_body(view.pod))
        answers.append(answer_of(pods, view, status, text))
    return answers


def report(answers: Sequence[Answer], namespace: str) -> list[str]:
    """What the API server answered, one line per pod and one per cause of a refusal."""
    lines = []
    for a in answers:
        if a.accepted:
            lines.append(f"pod/{a.pod} accepted (server dry run in namespace {namespace}; nothing created)")
            continue
        lines.append(f"pod/{a.pod} refused ({a.status}): {a.message}")
        if a.in_job_terms:
            lines.append(f"  in the job's terms: {a.in_job_terms}")
        for field, source, message in a.causes:
            where = field if source is None else f"{field} (the job's {source})"
            lines.append(f"  {where}: {message}" if field else f"  {message}")
    return lines


# --- the command ----------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=_PROG,
        description="Print the pods the operator creates for an SPMDJob (its first attempt), built by the "
        "operator's own pod builder, with the torchrun variables the worker gives each proc; or check them "
        "with the API server (--dry-run=server), creating nothing.",
        epilog="The job's uid and the attempt's agent token are placeholders until the job exists. "
        "monarch-spmd manifest ... --pods prints the pods of a torchrun command line.",
    )
    p.add_argument("-f", "--filename", required=True, metavar="FILE", help="the SPMDJob manifest (YAML or JSON; - "
                   "for standard input)")
    p.add_argument("-n", "--namespace", help="the namespace (default: the manifest's; else, for the dry run, the "
                   "kubeconfig context's, and for the view, default)")
    p.add_argument("-o", "--output", choices=FORMATS, default="yaml", help="yaml (default: every pod, with its "
                   "procs' torchrun variables as comments), json (a v1 List) or table (one line per pod)")
    p.add_argument("--dry-run", choices=("server",), dest="dry_run", help="server: POST every pod with dryRun=All "
                   "and print what the API server answered (nothing is created)")
    p.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig file for --dry-run (default: $KUBECONFIG or "
                   "~/.kube/config)")
    return p


def read_job(path: str, stdin: IO[str] | None = None) -> dict[str, Any]:
    """The one SPMDJob document of ``path`` (``-``: standard input), read as kubectl reads YAML."""
    try:
        from .validate import load_documents
    except ImportError:
        raise PodsError("reading a manifest needs PyYAML: pip install 'monarch-spmd[cli]'") from None
    try:
        if path == "-":
            text = (stdin or sys.stdin).read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except OSError as e:
        raise PodsError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        docs = load_documents(text)
    except Exception as e:  # noqa: BLE001 - the YAML parser's errors have no common base here
        raise PodsError(f"{path}: not valid YAML: {e}") from None
    jobs = [d for d in docs if isinstance(d, Mapping) and d.get("kind") == spec.KIND]
    if len(jobs) != 1:
        raise PodsError(f"{path}: expected one document of kind {spec.KIND} ({spec.API_VERSION}), found {len(jobs)}")
    return dict(jobs[0])


def run(opts: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
    doc = read_job(opts.filename)
    if opts.dry_run != "server":
        stdout.write(render(build(doc, namespace=opts.namespace), opts.output))
        return 0
    try:
        api_client, default_namespace = kubeconfig_rule.load(opts.kubeconfig)
    except kubeconfig_rule.ConfigError as e:
        raise PodsError(str(e)) from None
    written = (doc.get("metadata") or {}).get("namespace") if isinstance(doc.get("metadata"), Mapping) else None
    pods = build(doc, namespace=opts.namespace or (None if written else default_namespace))
    answers = dry_run(pods, api_client)
    for line in report(answers, pods.namespace):
        stdout.write(line + "\n")
    return 0 if all(a.accepted for a in answers) else 1


def main(argv: Sequence[str]) -> int:
    """``monarch-spmd pods``; returns the exit code (1 when the server refused a pod)."""
    return kubeconfig_rule.run_command(_PROG, argv, parser().parse_args, run, PodsError)
