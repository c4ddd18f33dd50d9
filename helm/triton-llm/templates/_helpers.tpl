{{/* Names and labels. */}}
{{- define "triton-llm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "triton-llm.fullname" -}}
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

{{- define "triton-llm.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "triton-llm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "triton-llm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "triton-llm.labels" -}}
helm.sh/chart: {{ include "triton-llm.chart" . }}
{{ include "triton-llm.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: server
{{- end }}

{{- define "triton-llm.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "triton-llm.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "triton-llm.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* The Secret with the gateway's bearer tokens, and the key holding them. */}}
{{- define "triton-llm.gatewaySecretName" -}}
{{- .Values.gateway.auth.existingSecret | default (printf "%s-gateway-auth" (include "triton-llm.fullname" .)) }}
{{- end }}

{{- define "triton-llm.gatewaySecretKey" -}}
{{- if .Values.gateway.auth.existingSecret }}{{ .Values.gateway.auth.existingSecretKey }}{{ else }}tokens{{ end }}
{{- end }}

{{/* Whether Triton's own HTTP/gRPC ports are offered to clients (not when the gateway's auth is on). */}}
{{- define "triton-llm.exposeTriton" -}}
{{- if not (and .Values.gateway.enabled .Values.gateway.auth.enabled) }}true{{ end }}
{{- end }}

{{/* A value as the launcher reads it: whole floats (YAML numbers) without an exponent. */}}
{{- define "triton-llm.scalar" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- end }}

{{/* One item quoted for the launcher's shell-like split (cli/serve.py settings_from_env). */}}
{{- define "triton-llm.shquote" -}}
'{{ replace "'" "'\"'\"'" . }}'
{{- end }}

{{/*
The model repository overrides (TRITON_LLM_SET): checkpoint and tokenizer paths from `model`, the
CPU device in CPU mode, every `engine` key as llm.KEY, then `extraOverrides`. One quoted item a line.
*/}}
{{- define "triton-llm.overrides" -}}
{{- $m := .Values.model }}
{{- $root := "" }}
{{- if eq $m.source "pvc" }}{{ $root = $m.pvc.mountPath }}{{ end }}
{{- $items := list }}
{{- $modelPath := "" }}
{{- if eq $m.source "pvc" }}
{{- $modelPath = clean (printf "%s/%s" $root $m.path) }}
{{- else if $m.path }}
{{- $modelPath = $m.path }}
{{- end }}
{{- if $modelPath }}
{{- $items = append $items (printf "llm.model_path=%s" $modelPath) }}
{{- end }}
{{- $tokenizer := $modelPath }}
{{- if $m.tokenizerPath }}
{{- $tokenizer = ternary (clean (printf "%s/%s" $root $m.tokenizerPath)) $m.tokenizerPath (eq $m.source "pvc") }}
{{- end }}
{{- if $tokenizer }}
{{- $items = append $items (printf "preprocess.tokenizer_path=%s" $tokenizer) }}
{{- $items = append $items (printf "postprocess.tokenizer_path=%s" $tokenizer) }}
{{- end }}
{{- if $m.draftPath }}
{{- $draft := ternary (clean (printf "%s/%s" $root $m.draftPath)) $m.draftPath (eq $m.source "pvc") }}
{{- $items = append $items (printf "llm.draft_model_path=%s" $draft) }}
{{- else if $modelPath }}
{{- /* config.pbtxt's draft is the demo's: it does not belong to another checkpoint */}}
{{- $items = append $items "llm.draft_model_path=none" }}
{{- end }}
{{- if and (not .Values.gpu.enabled) (not (hasKey .Values.engine "device")) }}
{{- $items = append $items "llm.device=cpu" }}
{{- end }}
{{- range $key, $value := .Values.engine }}
{{- $items = append $items (printf "llm.%s=%s" $key (include "triton-llm.scalar" $value)) }}
{{- end }}
{{- if hasKey .Values.engine "max_model_len" }}
{{- $items = append $items (printf "preprocess.max_model_len=%s" (include "triton-llm.scalar" .Values.engine.max_model_len)) }}
{{- end }}
{{- range .Values.extraOverrides }}
{{- $items = append $items . }}
{{- end }}
{{- range $items }}
{{ include "triton-llm.shquote" . }}
{{- end }}
{{- end }}

{{/* tritonserver arguments (TRITON_LLM_SERVER_ARGS): its exit timeout, then server.extraArgs. */}}
{{- define "triton-llm.serverArgs" -}}
{{- $args := list (printf "--exit-timeout-secs=%d" (int .Values.shutdown.exitTimeoutSeconds)) }}
{{- range .Values.server.extraArgs }}
{{- $args = append $args . }}
{{- end }}
{{- range $i, $a := $args }}{{ if $i }} {{ end }}{{ include "triton-llm.shquote" $a }}{{ end }}
{{- end }}

{{/* Checks that the schema cannot express. */}}
{{- define "triton-llm.validate" -}}
{{- if and (eq .Values.model.source "pvc") (not .Values.model.pvc.claimName) }}
{{- fail "model.pvc.claimName: required when model.source is pvc" }}
{{- end }}
{{- if and .Values.gateway.auth.enabled (not .Values.gateway.enabled) }}
{{- fail "gateway.auth.enabled: needs gateway.enabled" }}
{{- end }}
{{- if and .Values.gateway.auth.enabled (not .Values.gateway.auth.existingSecret) (not .Values.gateway.auth.tokens) }}
{{- fail "gateway.auth: set gateway.auth.existingSecret (a Secret with the tokens) or gateway.auth.tokens" }}
{{- end }}
{{- if and .Values.gateway.auth.existingSecret .Values.gateway.auth.tokens }}
{{- fail "gateway.auth: set either existingSecret or tokens, not both" }}
{{- end }}
{{- $s := .Values.shutdown }}
{{- $need := add $s.preStopSleepSeconds $s.drainTimeoutSeconds $s.exitTimeoutSeconds 5 }}
{{- if gt (int $need) (int .Values.terminationGracePeriodSeconds) }}
{{- fail (printf "terminationGracePeriodSeconds: %d is shorter than shutdown.preStopSleepSeconds + drainTimeoutSeconds + exitTimeoutSeconds + 5 (%d)" (int .Values.terminationGracePeriodSeconds) (int $need)) }}
{{- end }}
{{- $ownModel := or (eq .Values.model.source "pvc") .Values.model.path }}
{{- if and (eq (toString (.Values.engine.speculative_method | default "")) "draft") $ownModel (not .Values.model.draftPath) }}
{{- fail "model.draftPath: required when engine.speculative_method is draft with your own checkpoint (the default draft is the demo's)" }}
{{- end }}
{{- if and (not .Values.gpu.enabled) (hasPrefix "cuda" (toString (.Values.engine.device | default ""))) }}
{{- fail (printf "engine.device: %s needs gpu.enabled" .Values.engine.device) }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- fail "autoscaling.minReplicas: larger than autoscaling.maxReplicas" }}
{{- end }}
{{- end }}

{{/* OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_SERVICE_NAME when otel.endpoint is set. */}}
{{- define "triton-llm.otelEnv" -}}
{{- if .Values.otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.otel.endpoint | quote }}
- name: OTEL_SERVICE_NAME
  value: {{ .Values.otel.serviceName | default (include "triton-llm.fullname" .) | quote }}
{{- end }}
{{- end }}
