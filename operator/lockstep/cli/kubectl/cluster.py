"""The plugin's only I/O: reading the PDDeployment, its pods, Events and evidence, and
setting the restart annotation, with the official Kubernetes client."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import HTTPError as TransportError

from lockstep.api import constants as c
from lockstep.api import objects
from lockstep.cli.kubectl.common import REQUEST_TIMEOUT, Obj, PluginError
from lockstep.core.evidence import configmap_name

# --------------------------------------------------------------------------------- I/O


class Cluster:
    """The plugin's API calls: reads of one namespace, and the restart annotation."""

    def __init__(self, api: k8s.ApiClient, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.core = k8s.CoreV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)

    @classmethod
    def connect(cls, kubeconfig: str | None, context: str | None, namespace: str | None) -> Cluster:
        """A client as kubectl would make it (see the module docstring)."""
        try:
            contexts, active = k8s_config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
            chosen = active
            if context is not None:
                chosen = next((x for x in contexts if x.get("name") == context), None)
                if chosen is None:
                    names = ", ".join(str(x.get("name")) for x in contexts)
                    raise PluginError(f"--context {context!r}: not in the kubeconfig ({names})")
            api = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, persist_config=False
            )
        except (ConfigException, OSError) as err:
            raise PluginError(
                f"kubeconfig: {err} (set KUBECONFIG or pass --kubeconfig and --context)"
            ) from None
        ns = namespace or (chosen or {}).get("context", {}).get("namespace") or "default"
        return cls(api, ns)

    def _call(
        self,
        what: str,
        fn: Callable[..., Any],
        *args: Any,
        expect: Collection[int] = (),
        **kwargs: Any,
    ) -> Any:
        """One API call; an ApiException whose status is in `expect` is the caller's,
        anything else a PluginError saying what failed."""
        try:
            return fn(*args, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        except ApiException as err:
            if err.status in expect:
                raise
            raise PluginError(
                f"{what}: the API server answered {err.status}: {_reason(err)}"
            ) from None
        except TransportError as err:
            raise PluginError(
                f"{what}: cannot reach the API server at {self.api.configuration.host} "
                f"({type(err).__name__}); check --kubeconfig/--context and that it is up"
            ) from None

    def pdd(self, name: str) -> Obj:
        """The PDDeployment, with a 404 explained: no such deployment in this namespace
        (and which there are), or no PDDeployment API at all (the CRD is not installed)."""
        get = self.custom.get_namespaced_custom_object
        try:
            obj: Obj = self._call(
                f"reading PDDeployment {name}",
                get,
                c.GROUP,
                c.VERSION,
                self.namespace,
                c.PLURAL,
                name,
                expect=(404,),
            )
        except ApiException as err:
            if _details_name(err) is None:
                raise PluginError(
                    f"the API server at {self.api.configuration.host} serves no "
                    f"{c.CRD_NAME}: is lockstep installed (helm install lockstep "
                    "charts/lockstep)?"
                ) from None
            raise PluginError(self._not_found(name)) from None
        return obj

    def _not_found(self, name: str) -> str:
        text = f'PDDeployment "{name}" not found in namespace "{self.namespace}"'
        try:
            found = self._call(
                "listing PDDeployments",
                self.custom.list_namespaced_custom_object,
                c.GROUP,
                c.VERSION,
                self.namespace,
                c.PLURAL,
            )
        except PluginError:
            return f"{text} (another namespace? -n NAMESPACE)"
        names = ", ".join(
            sorted(str(objects.meta(i).get("name")) for i in found.get("items") or [])
        )
        there = f"PDDeployments there: {names}" if names else "it has no PDDeployments"
        return f"{text}; {there} (another namespace? -n NAMESPACE)"

    def pods(self, name: str) -> list[Obj]:
        """The deployment's pods (by its label)."""
        resp = self._call(
            f"listing the pods of {name}",
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=f"{c.LABEL_DEPLOYMENT}={name}",
            _preload_content=False,
        )
        items: list[Obj] = json.loads(resp.data).get("items") or []
        return items

    def events(self, uid: str) -> list[Obj]:
        """The Events about this PDDeployment object (by UID: not a namesake's)."""
        resp = self._call(
            "listing Events",
            self.core.list_namespaced_event,
            self.namespace,
            field_selector=f"involvedObject.uid={uid}",
            _preload_content=False,
        )
        items: list[Obj] = json.loads(resp.data).get("items") or []
        return items

    def evidence_configmap(self, name: str) -> Obj | None:
        """The deployment's evidence ConfigMap; None when there is none."""
        return self.configmap(configmap_name(name))

    def configmap(self, name: str) -> Obj | None:
        """A ConfigMap of the namespace; None when there is none."""
        try:
            resp = self._call(
                f"reading ConfigMap {name}",
                self.core.read_namespaced_config_map,
                name,
                self.namespace,
                _preload_content=False,
                expect=(404,),
            )
        except ApiException:
            return None
        cm: Obj = json.loads(resp.data)
        return cm

    def annotate(self, name: str, key: str, value: str, resource_version: str) -> bool:
        """Set one annotation, only on the version read (False: it changed meanwhile)."""
        body = {"metadata": {"annotations": {key: value}, "resourceVersion": resource_version}}
        try:
            self._call(
                f"annotating PDDeployment {name}",
                self.custom.patch_namespaced_custom_object,
                c.GROUP,
                c.VERSION,
                self.namespace,
                c.PLURAL,
                name,
                body,
                expect=(409,),
            )
        except ApiException:
            return False
        return True


def _reason(err: ApiException) -> str:
    try:
        body = json.loads(err.body or "")
    except (TypeError, ValueError):
        return str(err.reason)
    return str(body.get("message") or err.reason) if isinstance(body, dict) else str(err.reason)


def _details_name(err: ApiException) -> str | None:
    try:
        body = json.loads(err.body or "")
    except (TypeError, ValueError):
        return None
    details = body.get("details") if isinstance(body, dict) else None
    return details.get("name") if isinstance(details, dict) else None
