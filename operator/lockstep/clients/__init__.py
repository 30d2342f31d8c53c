"""The thin I/O: the one Kubernetes module (`kube`), the pod agents' client and its one
parser (`agent_client`), the routers' worker API (`router_workers`), the deep prober,
the leader election's Lease, the metrics. Nothing is decided here.
"""
