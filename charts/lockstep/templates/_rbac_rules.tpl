{{/* Rules for objects inside the watched namespaces (a Role there, or the ClusterRole). */}}
{{- define "lockstep.namespacedRules" -}}
# The custom resource: watch it; patch finalizers and kopf's progress annotations.
- apiGroups: ["lockstep.dev"]
  resources: ["pddeployments"]
  verbs: ["get", "list", "watch", "patch"]
# Conditions, per-group state and incidents go through the status subresource
# (a subresource has no list or watch; nothing reads it apart from the object).
- apiGroups: ["lockstep.dev"]
  resources: ["pddeployments/status"]
  verbs: ["patch"]
# The SGLang pods, one per (role, group, node rank): created per epoch, deleted a whole
# group at once on recovery, labels and annotations patched. get/list/watch are also what
# the router's Role grants, which RBAC lets the operator hand on only because it holds them.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# The readiness gate lockstep.dev/group-healthy is a pod status condition: draining or
# re-admitting a group reads the pod's conditions and patches the full list back.
- apiGroups: [""]
  resources: ["pods/status"]
  verbs: ["get", "patch"]
# Evidence before a group restart includes the last log lines of every pod of the group.
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
# Each group's headless rendezvous Service (its selector moves with the epoch) and the
# router's Service.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The router's ServiceAccount.
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The router's Role (pods get/list/watch for its service discovery) and RoleBinding.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The router's Deployment.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# An Event for every verdict and action (kopf.event posts core/v1 Events; a repeated
# Event is patched with a new count rather than created again).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
# The same Events through events.k8s.io/v1, the API newer Kubernetes clients record with.
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if and .Values.ha.enabled (include "lockstep.watchNamespaces" . | fromJsonArray) }}
# HA: kopf peering per watched namespace (keep-alives are patches of the peering object).
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end }}

{{/* Rules for cluster-scoped objects. */}}
{{- define "lockstep.clusterRules" -}}
# kopf watches CRDs to notice its resource (re)appearing; read-only.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
{{- if and .Values.ha.enabled (not (include "lockstep.watchNamespaces" . | fromJsonArray)) }}
# HA, every namespace: kopf peering in one ClusterKopfPeering.
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- if and .Values.webhook.enabled (not .Values.webhook.certManager.enabled) }}
# Self-signed webhook certificate: the operator patches its CA into the caBundle of this
# release's two webhook configurations, and no others.
- apiGroups: ["admissionregistration.k8s.io"]
  resources: ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"]
  resourceNames: [{{ include "lockstep.webhookConfigName" . | quote }}]
  verbs: ["get", "patch"]
{{- end }}
{{- end }}
