"""The pure core: every decision, no I/O (no kopf, no Kubernetes or HTTP client).

Spec in, objects and decisions out: the flag policy, the manifest builders, the reconcile
plan, the one judge (`verdicts`), the recovery planner, status, the evidence's shape.
"""
