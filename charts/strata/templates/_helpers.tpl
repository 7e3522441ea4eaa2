{{/* Names, labels and images shared by every template. */}}

{{/* The chart name, or nameOverride. */}}
{{- define "strata.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every object name: fullnameOverride, else the release name when it already
contains the chart name, else <release>-<chart>. Cut to 63 characters (DNS label). */}}
{{- define "strata.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* <fullname>-<suffix>, the suffix kept whole: the prefix is cut so the name fits 63. */}}
{{- define "strata.componentName" -}}
{{- $suffix := index . 1 -}}
{{- $prefix := include "strata.fullname" (index . 0) | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" -}}
{{- printf "%s-%s" $prefix $suffix -}}
{{- end -}}

{{- define "strata.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select pods: never change them (Deployment and DaemonSet selectors are
immutable). Components add app.kubernetes.io/component. */}}
{{- define "strata.selectorLabels" -}}
app.kubernetes.io/name: {{ include "strata.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object: the selector labels plus chart, version and manager. */}}
{{- define "strata.labels" -}}
helm.sh/chart: {{ include "strata.chart" . }}
{{ include "strata.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: strata
{{- end -}}

{{/* Image <repository>/<name>:<tag>; call with (list . "strata-operator"). */}}
{{- define "strata.image" -}}
{{- $root := index . 0 -}}
{{- printf "%s/%s:%s" ($root.Values.image.repository | trimSuffix "/") (index . 1) (default $root.Chart.AppVersion $root.Values.image.tag) -}}
{{- end -}}

{{- define "strata.operatorName" -}}
{{- include "strata.componentName" (list . "operator") -}}
{{- end -}}

{{- define "strata.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "strata.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "strata.csiNodeName" -}}
{{- include "strata.componentName" (list . "csi-node") -}}
{{- end -}}

{{- define "strata.webhookName" -}}
{{- include "strata.componentName" (list . "webhook") -}}
{{- end -}}

{{- define "strata.webhookSecretName" -}}
{{- include "strata.componentName" (list . "webhook-tls") -}}
{{- end -}}

{{/* The Secret where the operator keeps every cluster's data token for the CSI node plugin. */}}
{{- define "strata.csiTokensName" -}}
{{- include "strata.componentName" (list . "csi-tokens") -}}
{{- end -}}

{{/* The operator's own copy of every cluster's tokens (only the operator reads it). */}}
{{- define "strata.keptTokensName" -}}
{{- include "strata.componentName" (list . "cluster-tokens") -}}
{{- end -}}

{{/* The ClusterRole a namespace binds to the operator to let it use Secrets there. */}}
{{- define "strata.tenantRoleName" -}}
{{- include "strata.componentName" (list . "tenant") -}}
{{- end -}}

{{/* The namespaces where the chart binds the tenant role: the watched ones when not
cluster-wide, and rbac.tenantNamespaces. */}}
{{- define "strata.tenantNamespaces" -}}
{{- $namespaces := .Values.rbac.tenantNamespaces -}}
{{- if not .Values.operator.watchAllNamespaces -}}
{{- $namespaces = concat (include "strata.watchNamespaces" . | fromJsonArray) $namespaces -}}
{{- end -}}
{{- toJson (uniq $namespaces) -}}
{{- end -}}

{{- define "strata.peeringName" -}}
{{- default (include "strata.fullname" .) .Values.operator.peeringName -}}
{{- end -}}

{{/* The namespaces the operator watches when not cluster-wide (default: the release's). */}}
{{- define "strata.watchNamespaces" -}}
{{- $namespaces := .Values.operator.watchNamespaces | default (list .Release.Namespace) -}}
{{- toJson (uniq $namespaces) -}}
{{- end -}}

{{/* The CSI driver's name: fixed, it is what pods' volumes and PVs name. */}}
{{- define "strata.csiDriver" -}}csi.strata.dev{{- end -}}
