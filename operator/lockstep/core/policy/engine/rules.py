"""The policy's rules, each with the SGLang issues it comes from and what it does under
each safety mode, and the flags and environment variables the operator owns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lockstep.api import constants as c

Severity = Literal["error", "warning", "info"]
Action = Literal["adjusted", "rejected", "reported"]


@dataclass(frozen=True)
class Rule:
    """A policy rule: id, what it guards against, the SGLang issues behind it, and the
    SGLang releases it is for (None: every supported release)."""

    id: str
    title: str
    issues: tuple[str, ...] = ()
    versions: tuple[str, ...] | None = None

    def applies(self, version: str) -> bool:
        """Whether the rule is for SGLang `version`."""
        return self.versions is None or version in self.versions


RULES: dict[str, Rule] = {
    r.id: r
    for r in (
        Rule(
            "overlap-schedule",
            "The overlap scheduler on a TP>1 PD role without DP attention lets TP ranks "
            "decide batch-vs-idle differently and hang in mismatched collectives",
            ("sglang#26454", "sglang#20315", "sglang#20853"),
        ),
        Rule(
            "watchdog-timeout",
            "--watchdog-timeout must be set, positive and bounded (a shipped runtime used "
            "1000000, i.e. no watchdog)",
        ),
        Rule(
            "dist-timeout",
            "--dist-timeout must be set so torch.distributed init cannot wait forever",
        ),
        Rule(
            "operator-owned-flag",
            "Flags the operator writes from the PDDeployment (parallelism, rendezvous, "
            "ports, PD mode, transfer backend, model) may not be set in args",
        ),
        Rule("unknown-flag", "Flags must exist in the pinned SGLang's ServerArgs"),
        Rule("flag-value", "Flag values must have the arity, type and choices SGLang expects"),
        Rule("duplicate-flag", "A flag may be given once"),
        Rule("deprecated-flag", "The flag is deprecated in the pinned SGLang"),
        Rule(
            "spec-grammar-dp-attention-overlap",
            "Speculative decoding with grammar and DP attention under the overlap scheduler: "
            "idle DP ranks take a different collective path and hang",
            ("sglang#29144", "sglang#32527", "sglang#3600"),
        ),
        Rule(
            "hicache-prefetch-tp",
            "HiCache storage prefetch with TP>1: ranks issue a different number of "
            "all_reduce calls in check_prefetch_progress and deadlock",
            ("sglang#30760", "sglang#22607"),
        ),
        Rule(
            "decode-queue-collectives",
            "PD decode with TP>1: the preallocation/transfer queue poll skips its all_reduce "
            "when a rank's local queue is empty, so ranks can issue different collective "
            "sequences (present in 0.5.23)",
            ("sglang#36928",),
        ),
        Rule(
            "decode-transfer-hold",
            "PD decode with TP>1: a failed KV transfer is held or released by each rank on "
            "its own (0.5.23 agrees across ranks with an all_reduce first), so ranks can "
            "take different paths after a transfer failure",
            versions=("0.5.21", "0.5.22"),
        ),
        Rule(
            "sglang-version",
            "The SGLang release (spec.sglangVersion, or the image tag) must be one lockstep "
            "supports, and the two must agree",
        ),
        Rule(
            "operator-owned-env",
            "Environment variables the operator sets for the runtime, and every setting of "
            "lockstep's own runtime guard (LOCKSTEP_*: pod agent, consensus, probe, "
            "timeouts, state dir), may not be set in a role's env, in any mode",
        ),
        Rule(
            "guard-env",
            "Environment variables that switch off or loosen torch's guards (NCCL error "
            "handling, monitor and flight recorder): a bound holds in every form a setting "
            "can take",
        ),
        Rule(
            "step-bounds",
            "spec.health.stepBounds must fit under the watchdog each role runs with "
            "(--watchdog-timeout, else spec.safety.watchdogTimeoutSeconds): SGLang's "
            "watchdog ends a step past it, so a larger bound would be clamped to it",
        ),
        Rule(
            "config-file",
            "--config reads SGLang options from a file the policy cannot see, so no bound "
            "could hold for what it sets",
        ),
    )
}

# Flags the operator writes, by spelling: the PDDeployment field to use instead.
OWNED_FLAGS: dict[str, str] = {
    "tp_size": "spec.{role}.tp",
    "nnodes": "spec.{role}.podsPerGroup",
    "node_rank": "nothing: the operator sets it per pod",
    "dist_init_addr": "nothing: the operator sets it per group and epoch",
    "host": "nothing: the operator binds every pod",
    "port": "nothing: the operator assigns the ports",
    "disaggregation_mode": "nothing: it follows the role (spec.prefill / spec.decode)",
    "disaggregation_bootstrap_port": "nothing: the operator assigns the ports",
    "disaggregation_transfer_backend": "spec.transfer.backend",
    "disaggregation_ib_device": "spec.transfer.devices",
    "dp_size": "spec.{role}.dp",
    "attn_dp_size": "spec.{role}.dpAttention",
    "enable_dp_attention": "spec.{role}.dpAttention",
    "ep_size": "spec.{role}.ep",
    "model_path": "spec.model.path",
    "served_model_name": "spec.model.servedName",
    "pp_size": "nothing: lockstep v1alpha1 runs TP groups without pipeline parallelism",
}

# Env the operator sets for the runtime; users may not override these.
OWNED_ENV = (
    c.ENV_SGLANG_VERSION,
    c.ENV_CONSENSUS,
    c.ENV_GLOO_TIMEOUT,
    c.ENV_AGENT_PORT,
    c.ENV_GROUP_EPOCH,
    c.ENV_POD_NAME,
    c.ENV_AGENT_TOKEN,
)

# Every `LOCKSTEP_` variable is a setting of lockstep's own runtime (lockstep_sglang.config
# and the modules it reads for): the operator's, in every mode. What each one guards, for
# the message; one not listed is refused as "a setting of lockstep's runtime".
GUARD_ENV_PREFIX = "LOCKSTEP_"
RUNTIME_GUARD_ENV: dict[str, str] = {
    "LOCKSTEP_AGENT": "starts the pod agent; 0 switches it off, and the operator can no "
    "longer read the ranks' state, capture their stacks or restart the group in place",
    "LOCKSTEP_AGENT_HOST": "is the pod agent's address; the operator reaches it on the pod's IP",
    "LOCKSTEP_CONSENSUS": "switches the rank decision consensus; 0 switches it off, and a "
    "desync is no longer ended at once",
    "LOCKSTEP_CONSENSUS_PAUSE_S": "paces the ranks' decision comparisons; longer lets a "
    "desync run longer",
    "LOCKSTEP_GLOO_TIMEOUT_S": "caps SGLang's gloo CPU groups; the operator sets it from "
    "spec.safety.glooTimeoutSeconds",
    "LOCKSTEP_PROBE_TIMEOUT_S": "is the deep probe's default timeout",
    "LOCKSTEP_PROBE_MAX_TIMEOUT_S": "bounds the deep probe's timeout",
    "LOCKSTEP_EXIT_HOLD_S": "is how long a pod keeps serving its evidence after the server ends",
    "LOCKSTEP_STATE_DIR": "is where the ranks publish the state the pod agent serves",
    "LOCKSTEP_SUBPROCESS_START": "is how SGLang's schedulers start; the runtime forks them "
    "from the engine process where no device context makes that unsafe, and spawns them "
    "otherwise (it says which in the pod's start-up timeline)",
    "LOCKSTEP_TERMINATION_LOG": "is where the runtime writes why it refused to start; the "
    "operator reads it from the pod's status (the container's termination message)",
}
NCCL_GUARD_ENV: dict[str, str] = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "a timed-out NCCL collective no longer ends the "
    "process, so a wedged rank waits forever instead of failing",
    "TORCH_NCCL_ENABLE_MONITORING": "torch's NCCL heartbeat monitor is off, so a stuck "
    "NCCL watchdog is never noticed",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "the NCCL flight recorder no longer dumps on a timeout, "
    "so the evidence of a device-side hang is lost",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "the NCCL flight recorder keeps no trace, so the "
    "evidence of a device-side hang is lost",
}
NCCL_GUARD_OFF = ("0", "false", "False", "")

# NCCL flight recorder: keep a trace buffer and dump it when a collective times out, so
# the evidence of a device-side hang survives the restart.
FLIGHT_RECORDER_ENV = {
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/tmp/lockstep/nccl_trace_rank_",
}


# A decode server notices a dead prefill by its bootstrap heartbeat: SGLang's default
# (every 5 s, 2 misses) held requests waiting for KV from a dead prefill ~15 s before
# they failed and the router could retry them; every 2 s makes it ~4 s (measured on the
# real SGLang 0.5.23, docs/router.md). Defaults: a role's own env wins.
PEER_FAILURE_ENV: dict[str, dict[str, str]] = {
    "decode": {
        "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "2",
        "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "2",
    },
}
