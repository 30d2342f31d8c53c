"""Manifest builders: pods, headless Services and the router, as docs/architecture.md lays out (the path of an apply)."""

from __future__ import annotations

from typing import Any

from factories import load_example, pdd_obj

from lockstep.api import constants as c
from lockstep.api.models import PDDeployment, parse_pddeployment
from lockstep.core.builders import build_all, build_group_pods, build_group_service, dist_port
from lockstep.core.policy import evaluate


def deepseek() -> PDDeployment:
    obj = load_example("deepseek-v3")
    obj["metadata"]["uid"] = "uid-1"
    return parse_pddeployment(obj)


def kinds(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(o["kind"], o["metadata"]["name"]) for o in objects]


def test_one_pod_per_role_group_rank_and_a_service_per_group() -> None:
    objects = build_all(deepseek())
    names = kinds(objects)
    assert ("Pod", "deepseek-v3-prefill-0-0") in names
    assert ("Pod", "deepseek-v3-prefill-1-0") in names
    assert ("Pod", "deepseek-v3-decode-0-0") in names
    assert ("Pod", "deepseek-v3-decode-0-1") in names
    assert sum(k == "Pod" for k, _ in names) == 4
    assert ("Service", "deepseek-v3-prefill-0") in names
    assert ("Service", "deepseek-v3-decode-0") in names
    assert {("Deployment", "deepseek-v3-router"), ("Service", "deepseek-v3-router")} <= set(names)


def test_pods_of_a_group_rendezvous_on_rank_zero_of_their_epoch() -> None:
    pdd = deepseek()
    policy = evaluate(pdd.spec).roles["decode"]
    pods = build_group_pods(pdd, "decode", 0, epoch=7, policy=policy)
    for rank, pod in enumerate(pods):
        args = pod["spec"]["containers"][0]["args"]
        assert args[args.index("--node-rank") + 1] == str(rank)
        addr = args[args.index("--dist-init-addr") + 1]
        assert addr == f"deepseek-v3-decode-0-0.deepseek-v3-decode-0.inference.svc:{dist_port(7)}"
        assert args[args.index("--tp-size") + 1] == "16"
        assert args[args.index("--nnodes") + 1] == "2"
        assert pod["metadata"]["labels"][c.LABEL_EPOCH] == "7"
        assert pod["spec"]["subdomain"] == "deepseek-v3-decode-0"
    assert dist_port(7) != dist_port(8)


def test_pod_carries_labels_gate_resources_and_owner() -> None:
    pdd = deepseek()
    pod = build_group_pods(pdd, "decode", 0, 0, evaluate(pdd.spec).roles["decode"])[1]
    meta, spec = pod["metadata"], pod["spec"]
    labels = meta["labels"]
    assert labels[c.LABEL_DEPLOYMENT] == "deepseek-v3"
    assert (labels[c.LABEL_ROLE], labels[c.LABEL_GROUP], labels[c.LABEL_RANK]) == (
        "decode",
        "0",
        "1",
    )
    assert spec["readinessGates"] == [{"conditionType": "lockstep.dev/group-healthy"}]
    container = spec["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert container["resources"]["requests"]["memory"] == "512Gi"
    assert container["command"] == ["python3", "/opt/lockstep/runtime/launch.py"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SGLANG_ENABLE_RANK_CONSENSUS_CHECKER"] == "1"  # decode-queue guard (Enforce)
    assert env["LOCKSTEP_GROUP_EPOCH"] == "0"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert meta["ownerReferences"][0]["uid"] == "uid-1"
    assert meta["ownerReferences"][0]["controller"] is True
    # Rank 1 serves no HTTP: its readiness is its pod agent.
    assert container["readinessProbe"]["httpGet"]["port"] == "agent"
    # Rank 0's readiness is the deep probe (every rank's collective), bounded below the
    # probe's own timeout, not SGLang's /health (a generation that passes during warm-up).
    leader = build_group_pods(pdd, "decode", 0, 0, evaluate(pdd.spec).roles["decode"])[0]
    leader = leader["spec"]["containers"][0]
    assert leader["readinessProbe"]["httpGet"] == {
        "path": "/lockstep/probe?timeout=2",
        "port": "http",
    }
    assert leader["readinessProbe"]["timeoutSeconds"] == 3
    assert c.ANNOTATION_SPEC_HASH in meta["annotations"]


def test_user_env_and_weights_volume() -> None:
    obj = pdd_obj(
        decode={
            "tp": 1,
            "gpusPerPod": 1,
            "env": [
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}
            ],
        },
        model={"path": "/models/m", "weights": {"persistentVolumeClaim": "w"}},
    )
    pdd = parse_pddeployment(obj)
    pod = build_group_pods(pdd, "decode", 0, 0, evaluate(pdd.spec).roles["decode"])[0]
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "hf"
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["weights"]["persistentVolumeClaim"]["claimName"] == "w"


def test_sglangs_compile_and_jit_caches_live_on_a_pod_volume_unless_the_user_says_where() -> None:
    # SGLang puts every compile and JIT cache under SGLANG_CACHE_DIR; on an emptyDir they
    # outlive the container, so an in-place restart finds what its last start built.
    pdd = parse_pddeployment(pdd_obj())
    pod = build_group_pods(pdd, "decode", 0, 3, evaluate(pdd.spec).roles["decode"])[0]
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SGLANG_CACHE_DIR"] == c.CACHE_MOUNT
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts[c.CACHE_VOLUME] == c.CACHE_MOUNT
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols[c.CACHE_VOLUME] == {"name": c.CACHE_VOLUME, "emptyDir": {}}
    own = parse_pddeployment(
        pdd_obj(
            decode={
                "tp": 1,
                "gpusPerPod": 1,
                "env": [{"name": "SGLANG_CACHE_DIR", "value": "/shared/sglang-cache"}],
            }
        )
    )
    pod = build_group_pods(own, "decode", 0, 0, evaluate(own.spec).roles["decode"])[0]
    named = [e for e in pod["spec"]["containers"][0]["env"] if e["name"] == "SGLANG_CACHE_DIR"]
    assert named == [{"name": "SGLANG_CACHE_DIR", "value": "/shared/sglang-cache"}]


def test_group_service_is_headless_publishes_not_ready_and_selects_the_epoch() -> None:
    svc = build_group_service(deepseek(), "decode", 0, epoch=3)
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"][c.LABEL_EPOCH] == "3"
    assert svc["spec"]["ports"][0]["port"] == dist_port(3)


def test_router_discovers_rank_zero_pods_of_each_role() -> None:
    objects = build_all(deepseek())
    router = next(o for o in objects if o["kind"] == "Deployment")
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--pd-disaggregation" in args and "--service-discovery" in args
    pre = args[args.index("--prefill-selector") + 1 : args.index("--decode-selector")]
    assert sorted(pre) == sorted(
        ["lockstep.dev/deployment=deepseek-v3", "lockstep.dev/role=prefill", "lockstep.dev/rank=0"]
    )
    assert args[args.index("--policy") + 1] == "cache_aware"
    assert args[args.index("--service-discovery-namespace") + 1] == "inference"
    role = next(o for o in objects if o["kind"] == "Role")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]


def test_router_drops_a_dead_server_fast_unless_the_user_says_otherwise() -> None:
    def router_args(obj: dict[str, object]) -> list[str]:
        objects = build_all(parse_pddeployment(obj))
        deployment = next(o for o in objects if o["kind"] == "Deployment")
        return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])

    args = router_args(pdd_obj())
    value = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
    assert value["--health-check-interval-secs"] == "1"
    assert value["--health-failure-threshold"] == "2"
    assert value["--retry-max-retries"] == "2"
    assert value["--retry-initial-backoff-ms"] == "3000"
    mine = pdd_obj(router={"args": ["--health-check-interval-secs=5"]})
    args = router_args(mine)
    assert "--health-check-interval-secs" not in args  # the user's spelling is the only one
    assert args[-1] == "--health-check-interval-secs=5"


def test_decode_notices_a_dead_prefill_within_seconds_unless_the_user_says_otherwise() -> None:
    def env_of(obj: dict[str, object], role: str) -> dict[str, str | None]:
        pdd = parse_pddeployment(obj)
        pod = build_group_pods(pdd, role, 0, 0, evaluate(pdd.spec).roles[role])[0]
        return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}

    decode = env_of(pdd_obj(), "decode")
    assert decode["SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"] == "2"
    assert decode["SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE"] == "2"
    assert "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL" not in env_of(pdd_obj(), "prefill")
    own = [{"name": "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "value": "7"}]
    mine = env_of(pdd_obj(decode={"tp": 1, "gpusPerPod": 1, "env": own}), "decode")
    assert mine["SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"] == "7"  # once, the user's


def test_prefill_leader_advertises_its_bootstrap_port_to_the_router() -> None:
    pdd = deepseek()
    pod = build_group_pods(pdd, "prefill", 0, 0, evaluate(pdd.spec).roles["prefill"])[0]
    assert pod["metadata"]["annotations"]["sglang.ai/bootstrap-port"] == str(c.PORT_BOOTSTRAP)


def test_epochs_are_per_group_and_router_can_be_disabled() -> None:
    obj = load_example("deepseek-v3")
    obj["spec"]["router"]["enabled"] = False
    pdd = parse_pddeployment(obj)
    objects = build_all(pdd, epochs={("prefill", 1): 4})
    epochs = {
        o["metadata"]["name"]: o["metadata"]["labels"][c.LABEL_EPOCH]
        for o in objects
        if o["kind"] == "Pod"
    }
    assert epochs["deepseek-v3-prefill-1-0"] == "4"
    assert epochs["deepseek-v3-prefill-0-0"] == "0"
    assert all(o["kind"] != "Deployment" for o in objects)


def test_no_owner_reference_without_uid() -> None:
    pdd = parse_pddeployment(load_example("pd-small"))
    assert all("ownerReferences" not in o["metadata"] for o in build_all(pdd))


def test_spec_hash_changes_with_the_pod_template_only() -> None:
    def hashes(obj: dict[str, Any]) -> set[str]:
        pdd = parse_pddeployment(obj)
        return {
            o["metadata"]["annotations"][c.ANNOTATION_SPEC_HASH]
            for o in build_all(pdd)
            if o["kind"] == "Pod" and o["metadata"]["labels"][c.LABEL_ROLE] == "decode"
        }

    base = pdd_obj()
    assert hashes(base) == hashes(pdd_obj())
    changed = pdd_obj(decode={"tp": 1, "gpusPerPod": 1, "args": ["--trust-remote-code"]})
    assert hashes(base) != hashes(changed)


def test_sglang_container_may_be_traced_for_stacks() -> None:
    pdd = deepseek()
    pod = build_group_pods(pdd, "decode", 0, 0, evaluate(pdd.spec).roles["decode"])[0]
    caps = pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"]
    assert caps == ["SYS_PTRACE"]


def test_the_template_hash_ignores_the_epoch_so_an_in_place_restart_is_not_a_roll() -> None:
    pdd = deepseek()
    policy = evaluate(pdd.spec).roles["decode"]
    at0 = build_group_pods(pdd, "decode", 0, 0, policy)
    at7 = build_group_pods(pdd, "decode", 0, 7, policy)
    hashes = [
        [p["metadata"]["annotations"][c.ANNOTATION_SPEC_HASH] for p in ps] for ps in (at0, at7)
    ]
    assert hashes[0] == hashes[1]
    # ...while the pods themselves do move with the epoch, and a template change moves it.
    assert at7[1]["metadata"]["labels"][c.LABEL_EPOCH] == "7"
    obj = load_example("deepseek-v3")
    obj["spec"]["decode"]["resources"] = {"requests": {"cpu": "3"}, "limits": {}}
    changed = parse_pddeployment(obj)
    other = build_group_pods(changed, "decode", 0, 7, evaluate(changed.spec).roles["decode"])
    assert other[0]["metadata"]["annotations"][c.ANNOTATION_SPEC_HASH] != hashes[0][0]


def test_every_pod_reads_the_restart_token_from_the_deployments_secret() -> None:
    pdd = deepseek()
    objects = build_all(pdd, agent_token="t0ken")
    (secret,) = [o for o in objects if o["kind"] == "Secret"]
    assert secret["metadata"]["name"] == "deepseek-v3-agent-token"
    assert secret["stringData"] == {"token": "t0ken"}
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    for pod in (o for o in objects if o["kind"] == "Pod"):
        (var,) = [e for e in pod["spec"]["containers"][0]["env"] if e["name"] == c.ENV_AGENT_TOKEN]
        assert var["valueFrom"]["secretKeyRef"] == {
            "name": "deepseek-v3-agent-token",
            "key": "token",
        }
        assert "value" not in var
    # Rendered without a token, every render gets a fresh random one, never a fixed one.
    tokens = {
        o["stringData"]["token"] for _ in range(2) for o in build_all(pdd) if o["kind"] == "Secret"
    }
    assert len(tokens) == 2 and all(len(t) >= 32 for t in tokens)


def test_a_recreated_group_prefers_other_nodes_than_the_failing_ranks() -> None:
    pdd = deepseek()
    policy = evaluate(pdd.spec).roles["decode"]
    plain = build_group_pods(pdd, "decode", 0, 3, policy)
    avoiding = build_group_pods(pdd, "decode", 0, 3, policy, avoid_nodes=["gpu-b", "gpu-a"])
    assert all("affinity" not in p["spec"] for p in plain)
    for pod in avoiding:
        prefs = pod["spec"]["affinity"]["nodeAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ]
        # The API server takes one value per node field selector: one term per node.
        assert [p["preference"]["matchFields"] for p in prefs] == [
            [{"key": "metadata.name", "operator": "NotIn", "values": ["gpu-a"]}],
            [{"key": "metadata.name", "operator": "NotIn", "values": ["gpu-b"]}],
        ]
    # A preference, not a template change: the group is not rolled for it.
    assert [p["metadata"]["annotations"] for p in plain] == [
        p["metadata"]["annotations"] for p in avoiding
    ]


def test_a_stock_image_gets_the_runtime_from_an_init_container() -> None:
    """Default (runtime.inject): the operator's image copies the runtime into an emptyDir
    the SGLang container mounts read-only and starts with the image's own Python; with
    inject false the image's own entrypoint runs and nothing is added."""
    obj = load_example("pd-small")
    obj["spec"]["image"] = "lmsysorg/sglang:v0.5.23-cu130"
    pdd = parse_pddeployment(obj)
    pod = build_group_pods(pdd, "decode", 0, 0, evaluate(pdd.spec).roles["decode"])[0]
    spec = pod["spec"]
    (init,) = spec["initContainers"]
    assert init["image"] == c.DEFAULT_RUNTIME_IMAGE == "ghcr.io/lockstep-dev/operator:0.1.0"
    assert init["command"] == ["lockstep-runtime-install", "/opt/lockstep/runtime"]
    assert init["volumeMounts"] == [
        {"name": "lockstep-runtime", "mountPath": "/opt/lockstep/runtime"}
    ]
    assert {"name": "lockstep-runtime", "emptyDir": {"sizeLimit": "256Mi"}} in spec["volumes"]
    (sglang,) = spec["containers"]
    assert sglang["image"] == "lmsysorg/sglang:v0.5.23-cu130"
    assert sglang["command"] == ["python3", "/opt/lockstep/runtime/launch.py"]
    assert {
        "name": "lockstep-runtime",
        "mountPath": "/opt/lockstep/runtime",
        "readOnly": True,
    } in sglang["volumeMounts"]
    # The operator's own image (--runtime-image), or one named in the spec.
    from lockstep.api.models import with_runtime_image

    mirrored = with_runtime_image(pdd, "registry.local/lockstep/operator:0.1.0")
    pod = build_group_pods(mirrored, "decode", 0, 0, evaluate(pdd.spec).roles["decode"])[0]
    assert pod["spec"]["initContainers"][0]["image"] == "registry.local/lockstep/operator:0.1.0"
    obj["spec"]["runtime"] = {"image": "mine/operator:1", "python": "/usr/bin/python3.12"}
    named = with_runtime_image(parse_pddeployment(obj), "registry.local/x:1")
    pod = build_group_pods(named, "decode", 0, 0, evaluate(named.spec).roles["decode"])[0]
    assert pod["spec"]["initContainers"][0]["image"] == "mine/operator:1"
    assert pod["spec"]["containers"][0]["command"][0] == "/usr/bin/python3.12"
    # An image that carries the runtime itself.
    obj["spec"]["runtime"] = {"inject": False}
    own = parse_pddeployment(obj)
    pod = build_group_pods(own, "decode", 0, 0, evaluate(own.spec).roles["decode"])[0]
    assert "initContainers" not in pod["spec"]
    assert pod["spec"]["containers"][0]["command"] == ["lockstep-sglang"]
    assert all(v["name"] != "lockstep-runtime" for v in pod["spec"]["volumes"])
