"""`lockstep dev`: the embedded default — a real local control plane, the process kubelet,
the real operator, and incident drills on top of them."""
