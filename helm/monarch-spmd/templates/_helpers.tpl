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

{{/*
The operator's pods and nothing else (the `helm test` pod shares the selector labels): what the
metrics Service, the PodDisruptionBudget and the anti-affinity select.
*/}}
{{- define "monarch-spmd.operatorSelectorLabels" -}}
{{ include "monarch-spmd.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* "<fullname>-<suffix>" within 63 characters: the full name is cut, never the suffix. */}}
{{- define "monarch-spmd.suffixedName" -}}
{{- $root := index . 0 }}{{- $suffix := index . 1 }}
{{- printf "%s-%s" (include "monarch-spmd.fullname" $root | trunc (int (sub 62 (len $suffix))) | trimSuffix "-") $suffix }}
{{- end }}

{{/*
The metrics Service's name, "<fullname>-metrics". A Service name must start with a letter (DNS-1035)
and a release name need not: then it is "metrics-<fullname>".
*/}}
{{- define "monarch-spmd.metricsServiceName" -}}
{{- $name := include "monarch-spmd.suffixedName" (list . "metrics") }}
{{- if regexMatch "^[a-z]" $name }}
{{- $name }}
{{- else }}
{{- printf "metrics-%s" (include "monarch-spmd.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The leader-election Lease's name: leaderElection.leaseName, else the release's full name. */}}
{{- define "monarch-spmd.leaseName" -}}
{{- default (include "monarch-spmd.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/*
Checks across values that values.schema.json cannot express; each failure names the keys.
*/}}
{{- define "monarch-spmd.checkValues" -}}
{{- with .Values.leaderElection }}
{{- if .enabled }}
{{- if ge (int .renewDeadlineSeconds) (int .leaseDurationSeconds) }}
{{- fail (printf "leaderElection.renewDeadlineSeconds (%v) must be less than leaderElection.leaseDurationSeconds (%v): a leader must give up before a standby may take over" .renewDeadlineSeconds .leaseDurationSeconds) }}
{{- end }}
{{- if ge (int .retryPeriodSeconds) (int .renewDeadlineSeconds) }}
{{- fail (printf "leaderElection.retryPeriodSeconds (%v) must be less than leaderElection.renewDeadlineSeconds (%v): the leader must get at least one retry before its deadline" .retryPeriodSeconds .renewDeadlineSeconds) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (not .Values.leaderElection.enabled) (gt (int .Values.replicaCount) 1) }}
{{- fail (printf "replicaCount %v needs leaderElection.enabled: without a leader every replica would act on every job" .Values.replicaCount) }}
{{- end }}
{{- if and .Values.metrics.port (eq (int .Values.metrics.port) (int .Values.healthPort)) }}
{{- fail (printf "metrics.port (%v) must differ from healthPort (%v): both are served by the operator" .Values.metrics.port .Values.healthPort) }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.port) }}
{{- fail "metrics.serviceMonitor.enabled needs metrics.port (it is 0: no metrics to scrape)" }}
{{- end }}
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
