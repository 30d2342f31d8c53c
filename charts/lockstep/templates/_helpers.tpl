{{/* Names, labels and the few derived settings every template shares. */}}

{{- define "lockstep.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name; objects get suffixes of at most 11 characters. */}}
{{- define "lockstep.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "lockstep.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lockstep.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "lockstep.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "lockstep.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: lockstep
{{- end }}

{{- define "lockstep.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "lockstep.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image reference: the digest pins it; else the tag, defaulting to appVersion. */}}
{{- define "lockstep.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The namespaces the operator serves, as a JSON list (read with fromJsonArray). Empty means
every namespace, which only rbac.scope Cluster can grant.
*/}}
{{- define "lockstep.watchNamespaces" -}}
{{- if .Values.watchNamespaces }}
{{- toJson .Values.watchNamespaces }}
{{- else if eq .Values.rbac.scope "Namespaced" }}
{{- toJson (list .Release.Namespace) }}
{{- else }}
{{- toJson (list) }}
{{- end }}
{{- end }}

{{/* Namespaces that get the SGLang NetworkPolicies. */}}
{{- define "lockstep.networkPolicyNamespaces" -}}
{{- if .Values.networkPolicy.namespaces }}
{{- toJson .Values.networkPolicy.namespaces }}
{{- else }}
{{- $watched := include "lockstep.watchNamespaces" . | fromJsonArray }}
{{- toJson (default (list .Release.Namespace) $watched) }}
{{- end }}
{{- end }}

{{/* The Lease the replicas elect their leader with (ha.enabled), in the release's namespace. */}}
{{- define "lockstep.leaseName" -}}
{{- include "lockstep.fullname" . }}
{{- end }}

{{- define "lockstep.webhookServiceName" -}}
{{- printf "%s-webhook" (include "lockstep.fullname" .) }}
{{- end }}

{{/* Both webhook configurations (validating, mutating) carry this name. */}}
{{- define "lockstep.webhookConfigName" -}}
{{- include "lockstep.fullname" . }}
{{- end }}

{{- define "lockstep.webhookCertName" -}}
{{- printf "%s-webhook-tls" (include "lockstep.fullname" .) }}
{{- end }}

{{/* The Secret the self-signed webhook certificate is kept in, shared by every replica. */}}
{{- define "lockstep.webhookSelfSignedSecret" -}}
{{- printf "%s-webhook-cert" (include "lockstep.fullname" .) }}
{{- end }}

{{/* Settings that cannot work together fail the render with the fix. */}}
{{- define "lockstep.validate" -}}
{{- end }}

{{/* What the validating and the mutating webhook share. */}}
{{- define "lockstep.webhookCommon" -}}
{{- $watched := include "lockstep.watchNamespaces" . | fromJsonArray -}}
rules:
  - apiGroups: ["lockstep.dev"]
    apiVersions: ["v1alpha1"]
    operations: ["CREATE", "UPDATE"]
    resources: ["pddeployments"]
    scope: Namespaced
# Only spec changes are judged: kopf's own patches (finalizers, annotations) and the
# removal of finalizers on delete never wait on the webhook, so a policy change can
# never leave an existing PDDeployment stuck.
matchConditions:
  - name: spec-changed
    expression: "request.operation == 'CREATE' || object.spec != oldObject.spec"
{{- if $watched }}
# Only the namespaces this operator serves.
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: In
      values:
        {{- toYaml $watched | nindent 8 }}
{{- end }}
failurePolicy: {{ .Values.webhook.failurePolicy }}
sideEffects: None
admissionReviewVersions: ["v1"]
timeoutSeconds: {{ .Values.webhook.timeoutSeconds }}
{{- end }}
