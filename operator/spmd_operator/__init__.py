"""spmd_operator: the Kubernetes operator (kopf) for SPMDJob, in the folder ``operator/``.

The package is not named ``operator`` because that would shadow Python's standard module.
Layers, lowest first (a layer never imports a higher one; all may use ``monarch_spmd``)::

    names  ->  builders, lifecycle (pure)  ->  kube (API writes)
           ->  informer, events, errors, leader, metrics, observer (one connection), jobloop
           ->  the controller's parts: payloads, collector, workloads, observers, memory,
               then view and creation (which read and create payloads)
           ->  controller  ->  handlers (kopf)  ->  __main__

Start it with ``python -m spmd_operator --all-namespaces`` (see ``__main__``).
"""
