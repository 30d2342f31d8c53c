"""The operator process: kopf's handlers (`operator`), several replicas (`ha`), the
admission webhook server (`admission`) and the one typed configuration (`settings`).
Thin: each handler wires the control round or the pure core to kopf.
"""
