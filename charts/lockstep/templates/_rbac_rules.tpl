{{/* Rules for objects inside the watched namespaces (a Role there, or the ClusterRole). */}}
{{- define "lockstep.namespacedRules" -}}
# The custom resource: list and watch it (kopf); patch its annotations (the planner's
# records and incident history, kopf's progress). Never a get: the watch is the read.
- apiGroups: ["lockstep.dev"]
  resources: ["pddeployments"]
  verbs: ["list", "watch", "patch"]
# Conditions, per-group state and incidents go through the status subresource
# (a subresource has no list or watch; nothing reads it apart from the object).
- apiGroups: ["lockstep.dev"]
  resources: ["pddeployments/status"]
  verbs: ["patch"]
# Every object the operator creates names its PDDeployment as controller owner with
# blockOwnerDeletion; where the OwnerReferencesPermissionEnforcement admission plugin runs
# (OpenShift, hardened clusters) setting that takes update on the owner's finalizers.
- apiGroups: ["lockstep.dev"]
  resources: ["pddeployments/finalizers"]
  verbs: ["update"]
# The SGLang pods, one per (role, group, node rank): listed and watched (the operator's
# cache; control rounds never list), created per epoch, deleted a whole group at once
# (Recreate restarts, scale-down) and relabelled with the new epoch before an in-place
# restart. get the operator never calls: it holds it because the router's Role grants
# it (pods get/list/watch for service discovery), and RBAC lets a user create a Role
# only with permissions it holds itself.
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
# The pod agents' restart token (in-place restarts): one Secret <name>-agent-token per
# PDDeployment, created once with a random token (owned by it, garbage-collected with it)
# and read back when the operator starts. RBAC cannot narrow get to those names (they
# follow each PDDeployment's), so watchNamespaces is how to bound which Secrets this is.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create"]
# Each group's headless rendezvous Service (listed and watched: the operator's cache; its
# selector and port patched as the epoch moves, deleted on scale-down) and the router's
# Service (created).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# The evidence store: one ConfigMap <name>-evidence per PDDeployment (owned by it), with
# what was captured before each restart; read when the operator starts, created, then
# patched as incidents come and go.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch"]
# The router's objects follow spec.router (owned by the PDDeployment): created when the
# router is on, patched when the spec changes or someone edited them, deleted when it is
# turned off. Its ServiceAccount,
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["create", "patch", "delete"]
# its Role (pods get/list/watch for service discovery) and RoleBinding,
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["create", "patch", "delete"]
# and its Deployment (listed and watched: the operator's cache, so drift shows at once).
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# Per-role scale targets (PDRoleScale, lockstep.dev): one object per role, read through
# the operator's watch (list, watch), created, and patched when a person's edit of the
# PDDeployment's replicas wins (docs/autoscaling.md); garbage-collected with the
# PDDeployment.
- apiGroups: ["lockstep.dev"]
  resources: ["pdrolescales"]
  verbs: ["list", "watch", "create", "patch"]
# Its status (the rule's record, the groups the role has and has ready) is the operator's.
- apiGroups: ["lockstep.dev"]
  resources: ["pdrolescales/status"]
  verbs: ["patch"]
# Node maintenance: a PodDisruptionBudget per group and name slot, so a `kubectl drain`
# (the eviction API) never takes a pod of a serving group; the operator moves the group
# itself. Watched (a deleted or edited budget is put back), created, patched (a changed
# group size), deleted with the group.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# An Event for every verdict and action (kopf.event posts a new core/v1 Event each time;
# it neither patches Events nor uses events.k8s.io).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{/* Rules for cluster-scoped objects. */}}
{{- define "lockstep.clusterRules" -}}
# kopf lists and watches CRDs to notice its resource (re)appearing; read-only.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
# Node maintenance: which node each pod runs on is cordoned or being drained
# (spec.unschedulable, taints) and where it sits (topology labels). Nodes exist only
# cluster-wide, so this is here even when the operator watches some namespaces; read-only,
# unless rbac.cordonNodes lets it cordon a suspect node (spec.recovery.suspectNodes).
- apiGroups: [""]
  resources: ["nodes"]
  verbs: {{ if .Values.rbac.cordonNodes }}["list", "watch", "patch"]{{ else }}["list", "watch"]{{ end }}
{{- if and .Values.webhook.enabled (not .Values.webhook.certManager.enabled) }}
# Self-signed webhook certificate: the operator patches its CA into the caBundle of this
# release's two webhook configurations, and no others.
- apiGroups: ["admissionregistration.k8s.io"]
  resources: ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"]
  resourceNames: [{{ include "lockstep.webhookConfigName" . | quote }}]
  verbs: ["get", "patch"]
{{- end }}
{{- end }}

{{/* Rules in the release's own namespace (a Role there, whatever the scope). */}}
{{- define "lockstep.releaseRules" -}}
{{- if .Values.ha.enabled }}
# Leader election: the replicas read, create and renew one Lease (an update under its
# resourceVersion: of two writers one is refused), and the new leader posts an Event on it.
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["create"]
# (create cannot be limited to a name; reading and renewing can.)
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  resourceNames: [{{ include "lockstep.leaseName" . | quote }}]
  verbs: ["get", "update"]
# The Event on the Lease when a replica takes the lead.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
{{- if and .Values.webhook.enabled (not .Values.webhook.certManager.enabled) }}
# Self-signed webhook certificate: the first replica makes it and keeps it in one Secret,
# every replica (and every restart) reads and serves that one.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
# (reading is limited to that one Secret.)
- apiGroups: [""]
  resources: ["secrets"]
  resourceNames: [{{ include "lockstep.webhookSelfSignedSecret" . | quote }}]
  verbs: ["get"]
{{- end }}
{{- end }}
