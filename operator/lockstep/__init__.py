"""lockstep: keep SGLang PD tensor-parallel groups in lockstep on Kubernetes."""

__version__ = "0.1.0"
