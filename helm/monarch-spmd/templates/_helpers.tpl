{{/*
Names and labels shared by every template. Kubernetes names and label values are capped at 63
characters, so each name is truncated there and a trailing "-" is trimmed.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "monarch-spmd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The fully qualified app name: fullnameOverride, else "<release>-<chart>", else the release name
when it already contains the chart name.
*/}}
{{- define "monarch-spmd.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* "<chart>-<version>" for the helm.sh/chart label. */}}
{{- define "monarch-spmd.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object of the release. */}}
{{- define "monarch-spmd.labels" -}}
helm.sh/chart: {{ include "monarch-spmd.chart" . }}
{{ include "monarch-spmd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: monarch-spmd
{{- end }}

{{/* Labels the operator Deployment selects its pods by (immutable once installed). */}}
{{- define "monarch-spmd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "monarch-spmd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "monarch-spmd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "monarch-spmd.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image reference; the tag defaults to the chart's appVersion. */}}
{{- define "monarch-spmd.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The worker image the `helm test` SPMDJob runs; the tag defaults to the chart's appVersion. */}}
{{- define "monarch-spmd.testImage" -}}
{{- printf "%s:%s" .Values.tests.image.repository (default .Chart.AppVersion .Values.tests.image.tag) }}
{{- end }}

{{/*
The prefix of the `helm test` SPMDJob's name; the test pod appends "-" and 5 characters of its
uid. It starts with a letter (a release name need not) and stays within 44 characters, so the
name is a DNS-1035 label of at most 50 (the SPMDJob limit that keeps child names valid).
*/}}
{{- define "monarch-spmd.testJobPrefix" -}}
{{- printf "test-%s" (include "monarch-spmd.fullname" .) | trunc 44 | trimSuffix "-" }}
{{- end }}
