"""CPU stand-in for the patched SGLang server: what a local-cluster "GPU pod" runs.

``python -m lockstep_standin <SGLang server argv>`` behaves, for the operator,
like ``lockstep-sglang`` on a GPU node: real ``torch.distributed`` gloo TP ranks in
separate processes, joined across the pods of a group, running a scheduler loop shaped
like SGLang's with the real runtime pieces (:class:`lockstep_sglang.standalone.StandaloneRank`:
decision consensus, collective probe, rank state, collective tracing; the pod agent;
bounded gloo timeouts), serving deterministic tokens. No model, no GPU.

Argv (what ``operator/lockstep/core/policy/engine.py`` and ``builders.py`` render)::

    --model-path P --disaggregation-mode prefill|decode|null --tp-size N --nnodes K
    --node-rank r --dist-init-addr HOST:PORT --host H --port 30000
    --disaggregation-bootstrap-port 8998 --disaggregation-transfer-backend B
    [--served-model-name S] [--dp-size D] ...

Any other flag is accepted, logged once and ignored. ``--tp-size`` must be a multiple of
``--nnodes``; ``--dist-init-addr`` is required when ``--nnodes`` > 1 and must be an IP
(the rank-0 pod's address): global rank 0 serves the rendezvous store there. ``--host``
is ignored: every pod shares one network namespace, so the pod binds ``LOCKSTEP_POD_IP``.
Bad argv or env: exit 2 with the reason on stderr.

Environment:

| variable | default | meaning |
| --- | --- | --- |
| ``LOCKSTEP_POD_IP`` | ``127.0.0.1`` | the pod's loopback address: HTTP, agent, store bind here |
| ``LOCKSTEP_POD_DIR`` | a new temp dir | private dir of the pod: ``state/``, ``ranks.json``, ``fault.json`` |
| ``LOCKSTEP_AGENT_PORT`` | ``8790`` | pod agent port (the operator renders 8999) |
| ``LOCKSTEP_GLOO_TIMEOUT_SECONDS`` | ``600`` | every gloo group's timeout (alias ``LOCKSTEP_GLOO_TIMEOUT_S``) |
| ``SGLANG_ENABLE_RANK_CONSENSUS_CHECKER`` | on | decision consensus (``LOCKSTEP_CONSENSUS`` overrides) |
| ``LOCKSTEP_CONSENSUS_PAUSE_S`` | ``0.05`` | pause between consensus comparisons |
| ``LOCKSTEP_GROUP_EPOCH``, ``LOCKSTEP_POD_NAME`` | unset | echoed by ``/ranks``; the epoch also prefixes the store keys (``state/epoch``, written by an in-place restart, overrides it and moves the rendezvous port) |
| ``LOCKSTEP_AGENT_TOKEN`` | unset | the token the agent's ``/ranks``, ``/stacks`` and ``/restart`` require (unset: they answer 403) |
| ``LOCKSTEP_PROBE_TIMEOUT_S`` / ``_MAX_TIMEOUT_S`` | ``5`` / ``60`` | ``/lockstep/probe`` timeouts |
| ``LOCKSTEP_STANDIN_IDLE_S`` | ``0.25`` | longest idle wait of rank 0 per iteration (requests wake it at once) |
| ``LOCKSTEP_STANDIN_STEP_S`` | ``0.002`` | extra time of one forward step |
| ``LOCKSTEP_STANDIN_REQUEST_TIMEOUT_S`` | ``30`` | a request without an answer by then gets 504 |
| ``LOCKSTEP_STANDIN_RENDEZVOUS_TIMEOUT_S`` | ``300`` | how long ranks wait for the group to form |

Processes: the pod's main process (:mod:`.pod`) starts ``tp/nnodes`` rank processes
(:mod:`.scheduler`, global ranks ``node_rank*tp/nnodes ...``), serves the pod agent
(``GET /ranks``, ``POST /stacks``, ``POST /restart``, ``GET /healthz``) on ``LOCKSTEP_POD_IP:LOCKSTEP_AGENT_PORT``
and, on node rank 0, the HTTP server (:mod:`.server`) on ``LOCKSTEP_POD_IP:--port``. When
any local rank ends, the main process kills the others and exits non-zero at once; a
rank whose peer vanished fails its next gloo operation (at once for a dead peer, at the
gloo timeout for a stalled one) and so ends its pod too.

Exit status of the pod: 0 after ``SIGTERM``/``SIGINT`` (ranks stopped, ``SIGKILL``
after 3 s); 2 refused to start; 75 restarted in place by the agent (ranks ``SIGKILL``ed); otherwise that of the first rank to end — 1 for a
consensus divergence or a failed collective (gloo timeout, vanished peer), ``128+N`` for
a rank killed by signal ``N`` — never 0.

Files in ``LOCKSTEP_POD_DIR``:

- ``state/rank-<r>.state`` (+ ``rank-<r>.failure.json`` after a consensus failure;
  ``state/previous/`` keeps the last incarnation's): the runtime's rank state;
- ``ranks.json``: ``{"pod", "epoch", "pid", "node_rank", "ranks": [{"rank", "pid"}]}``,
  for tooling that kills (``SIGKILL``) or stalls (``SIGSTOP``) a rank;
- ``requests.jsonl``: the request log (see HTTP below);
- ``fault.json`` (written by tooling, see :mod:`lockstep_sglang.faults`):
  ``{"kind": "none"|"desync"|"hang"|"slow"|"stuck-in-kernel", "ranks": [..] | null,
  "step_seconds": s, "epoch": e | null}``. ``desync``: the named rank decides the opposite of its peers
  (idle while they batch, a phantom batch while they idle) → the consensus ends every
  rank within about a second, with the diverging decision in the evidence. ``hang``: the named
  rank waits on a receive no peer matches, inside ``run_batch`` (``tp:device``) when
  the group has requests, inside the next request broadcast (``broadcast_pyobj`` on
  ``tp:cpu``) when it is idle; decisions stay identical (no consensus failure), every
  rank shows the same collective with no progress, the probe times out; the gloo
  timeout ends the group. ``slow``: each batch of the named ranks takes ``step_seconds`` longer,
  and so the group's (the forward's collective carries it: every rank waits out the
  slowest, from the same iteration on); iterations keep advancing. ``stuck-in-kernel``:
the named rank, inside its next ``run_batch``, waits in the kernel in uninterruptible
sleep (``D``, as a GPU driver call that never returns; :mod:`lockstep_standin.kernel_wait`)
until killed, its peers waiting for it in the forward's collective. The file survives a
  container restart (same pod directory): clear it, or set ``epoch``, so a restarted
  group does not fail again.

HTTP (leader pod): ``GET /health`` (200 once the loop runs, 503 before — like SGLang's,
blind to a wedged group), ``GET /health_generate`` (one token through the group, 503 on
failure), ``GET /get_model_info``, ``GET /get_server_info``, ``GET /v1/models``,
``POST /generate`` (``{"text": str | [str], "sampling_params": {"max_new_tokens": n},
"rid"?, "bootstrap_host"?, "bootstrap_port"?, "bootstrap_room"?}`` →
``{"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens",
"completion_tokens", "e2e_latency", "bootstrap_*", "disaggregation_mode", ...}}``),
``POST /v1/completions`` (OpenAI: ``prompt``, ``max_tokens``), ``GET /lockstep/probe
[?timeout=s]`` (the runtime's ``ProbeGate``: 200 ok, 504 timeout, 500 failed, 503
starting; one probe in flight, expired probes dropped before the broadcast);
``/model_info`` and ``/server_info`` answer as their ``get_`` forms. A request with
``bootstrap_room`` is one half of a PD pair, as sglang-router sends them
(:mod:`.kv`): a prefill pod computes the first token and hands the "KV" over on its
bootstrap server (``--disaggregation-bootstrap-port``), a decode pod waits for that
hand-off from ``bootstrap_host:bootstrap_port`` before it generates (502 when it does not
come). Every generation request is logged to ``requests.jsonl`` in the pod directory
when it arrives and when it is answered or fails. Requests
that get no answer within ``LOCKSTEP_STANDIN_REQUEST_TIMEOUT_S`` get 504, and rank 0
drops or aborts them on every rank; 503 above 1024 waiting requests; streaming is refused
(400). Text is deterministic: :func:`lockstep_standin.protocol.expected_text`.

Never imports the operator package; torch is imported only by the rank processes.
"""
