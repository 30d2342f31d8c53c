"""The resource and its names: the PDDeployment's types (`models`), Kubernetes' own
rules for the values lockstep writes (`k8s_rules`), the names shared by the operator
(`constants`) and reading Kubernetes object dicts (`objects`). Pure; the lowest layer.
"""
