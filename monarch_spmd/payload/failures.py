"""Which failures are permanent: THE statement of the rule, for the operator, the runner and the agent.

Where it sits: in the payload (standard library only, shipped into pods), beside
:mod:`.names`. :func:`monarch_spmd.policy.is_permanent` (the operator's and the local runner's
view, from a parsed spec) and the in-pod coordinator (:mod:`.rendezvous`, from the worker's
MONARCH_SPMD_* inputs) both decide through :func:`is_permanent`, so a restart in place and a
restart by recreating pods judge a failure alike.

The rules, in order (the first that matches decides):

1. a reason in ``permanent_reasons``, or one no waiting fixes (:data:`FATAL_REASONS`): permanent;
2. a disruption (:func:`is_disruption`: preemption, eviction, node drain or loss): retryable
   (and it does not use up maxRestarts; the operator counts those);
3. an exit code in ``permanent_exit_codes``: permanent; in ``retryable_exit_codes``: retryable
   (what the user lists explicitly wins over the defaults below);
4. the worker's 64 (bad input): permanent; its 75 (retryable by design): retryable;
5. when ``retryable_exit_codes`` is non-empty, any other exit code: permanent;
6. anything else (another exit code, a pod lost, a hang): retryable.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

from .names import EX_TEMPFAIL, EX_USAGE

#: Pod or container reasons that no amount of waiting or retrying fixes.
FATAL_REASONS: Final = frozenset({"InvalidImageName", "ErrImageNeverPull"})

#: Reasons of the pod condition ``DisruptionTarget`` (and of pod status) that mean the pod was
#: taken away by the cluster, not failed by the program: preemption, API-initiated eviction
#: (``kubectl drain``), taint-based eviction, pod GC after node loss, kubelet node-pressure or
#: graceful node shutdown. Kubernetes Job's podFailurePolicy and JobSet treat these alike. Also
#: the operator's own PodDeleted (a pod deleted before it finished: ``kubectl delete pod``, a
#: controller's delete) and PodMissing (a pod gone without a word of why): something outside the
#: program took the pod away, so neither uses up maxRestarts (docs/failures.md).
DISRUPTION_REASONS: Final = frozenset(
    {
        "PreemptionByScheduler",
        "PreemptionByKubeScheduler",
        "EvictionByEvictionAPI",
        "DeletionByTaintManager",
        "DeletionByPodGC",
        "TerminationByKubelet",
        "Evicted",
        "Terminated",
        "NodeLost",
        "PodDeleted",
        "PodMissing",
    }
)


def is_disruption(reason: str | None) -> bool:
    """Whether a pod failure ``reason`` means the cluster took the pod away (see DISRUPTION_REASONS)."""
    return bool(reason) and reason in DISRUPTION_REASONS


def is_permanent(
    exit_code: int | None,
    reason: str | None,
    *,
    permanent_reasons: Collection[str] = (),
    permanent_exit_codes: Collection[int] = (),
    retryable_exit_codes: Collection[int] = (),
) -> bool:
    """Whether a failure with this exit code and reason fails the job without a restart.

    See the module docstring for the order of the rules. ``exit_code`` is None when there is no
    process exit code (a pod lost, a member's agent gone).
    """
    if reason and (reason in permanent_reasons or reason in FATAL_REASONS):
        return True
    if is_disruption(reason):
        return False
    if exit_code is None or exit_code == 0:
        return False
    if exit_code in permanent_exit_codes:
        return True
    if exit_code in retryable_exit_codes:
        return False
    if exit_code == EX_USAGE:
        return True
    if exit_code == EX_TEMPFAIL:
        return False
    return bool(retryable_exit_codes)
