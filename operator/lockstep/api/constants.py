"""Names shared by the operator, its builders and its tests: one place for each."""

from __future__ import annotations

from lockstep import __version__

GROUP = "lockstep.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PDDeployment"
PLURAL = "pddeployments"
SINGULAR = "pddeployment"
SHORT_NAME = "pdd"
CRD_NAME = f"{PLURAL}.{GROUP}"

# The newest SGLang release lockstep supports (every supported one has a flag table in
# lockstep/core/policy/sglang_flags and pins in lockstep_sglang/sglang_pins).
SGLANG_VERSION = "0.5.23"

ROLES = ("prefill", "decode")

# The largest --dist-timeout (and spec.safety.distTimeoutSeconds) lockstep accepts.
MAX_DIST_TIMEOUT_SECONDS = 7200

# Runtime injection into stock SGLang images (lockstep_sglang.install): the init
# container's image (the operator's own, which carries the runtime), command and volume,
# and where the SGLang container finds the launcher.
DEFAULT_RUNTIME_IMAGE = f"ghcr.io/lockstep-dev/operator:{__version__}"  # the chart's default
RUNTIME_INSTALL = "lockstep-runtime-install"
RUNTIME_VOLUME = "lockstep-runtime"
RUNTIME_MOUNT = "/opt/lockstep/runtime"
RUNTIME_LAUNCH = f"{RUNTIME_MOUNT}/launch.py"
# SGLang's compile and JIT caches (SGLANG_CACHE_DIR: Triton, Inductor, the CUDA JIT,
# DeepGEMM, FlashInfer, TileLang, CuTe AOT and SGLang's own JIT kernels live under it in
# SGLang 0.5.21-0.5.23) on a volume of the pod, so an in-place restart keeps them.
CACHE_VOLUME = "sglang-cache"
CACHE_MOUNT = "/var/cache/sglang"
ENV_SGLANG_CACHE_DIR = "SGLANG_CACHE_DIR"

# Labels on every object the operator owns.
LABEL_DEPLOYMENT = f"{GROUP}/deployment"
LABEL_ROLE = f"{GROUP}/role"
LABEL_GROUP = f"{GROUP}/group"
LABEL_RANK = f"{GROUP}/rank"
LABEL_EPOCH = f"{GROUP}/epoch"
# The name slot of a group's pods (absent: slot 0); see builders.group_name.
LABEL_SLOT = f"{GROUP}/slot"
LABEL_COMPONENT = f"{GROUP}/component"
APP_NAME = "app.kubernetes.io/name"
APP_INSTANCE = "app.kubernetes.io/instance"
APP_COMPONENT = "app.kubernetes.io/component"
APP_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "lockstep"

# The readiness gate the operator flips to take a whole group out of the router's view.
READINESS_GATE = f"{GROUP}/group-healthy"

# Annotations.
ANNOTATION_SPEC_HASH = f"{GROUP}/spec-hash"

# Kueue plain-pod groups (spec.<role>.placement.gang.kueue): one group per group epoch.
KUEUE_QUEUE_NAME = "kueue.x-k8s.io/queue-name"
KUEUE_POD_GROUP_NAME = "kueue.x-k8s.io/pod-group-name"
KUEUE_POD_GROUP_TOTAL_COUNT = "kueue.x-k8s.io/pod-group-total-count"

# Ports inside every SGLang pod.
PORT_HTTP = 30000
PORT_BOOTSTRAP = 8998
PORT_AGENT = 8999
# The torch.distributed rendezvous port moves with the epoch, so a rank of an old
# epoch can never join the new one: DIST_PORT_BASE + epoch % DIST_PORT_SPAN.
DIST_PORT_BASE = 20000
DIST_PORT_SPAN = 1000
PORT_ROUTER = 8000
PORT_ROUTER_METRICS = 29000

# Env the runtime (lockstep_sglang) reads.
ENV_CONSENSUS = "SGLANG_ENABLE_RANK_CONSENSUS_CHECKER"
ENV_GLOO_TIMEOUT = "LOCKSTEP_GLOO_TIMEOUT_SECONDS"
ENV_AGENT_PORT = "LOCKSTEP_AGENT_PORT"
ENV_GROUP_EPOCH = "LOCKSTEP_GROUP_EPOCH"
ENV_POD_NAME = "LOCKSTEP_POD_NAME"
ENV_SGLANG_VERSION = "LOCKSTEP_SGLANG_VERSION"  # lockstep_sglang.config (declared release)
# The pod agent's `POST /restart` token, from the deployment's agent-token Secret.
ENV_AGENT_TOKEN = "LOCKSTEP_AGENT_TOKEN"
# The runtime's test-only fault switch (lockstep_sglang.faults): never rendered.
ENV_TEST_FAULT_FILE = "LOCKSTEP_TEST_FAULT_FILE"
AGENT_TOKEN_KEY = "token"
