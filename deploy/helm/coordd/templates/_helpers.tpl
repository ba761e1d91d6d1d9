{{/* The release's name for its objects, at most 63 characters. */}}
{{- define "coordd.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The headless Service that gives each member its stable DNS name. */}}
{{- define "coordd.peers" -}}
{{- printf "%s-peers" (include "coordd.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "coordd.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "coordd.labels" -}}
{{ include "coordd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* http or https, for the API's HTTP port and the probes. */}}
{{- define "coordd.httpScheme" -}}
{{- if .Values.tls.secretName -}}HTTPS{{- else -}}HTTP{{- end -}}
{{- end -}}

{{- define "coordd.peerScheme" -}}
{{- if .Values.peerTLS.secretName -}}https{{- else -}}http{{- end -}}
{{- end -}}

{{/* A member's peer host: <pod>.<peers>.<namespace>.svc.<domain>. */}}
{{- define "coordd.peerHost" -}}
{{- printf "%s.%s.%s.svc.%s" .pod (include "coordd.peers" .root) .root.Release.Namespace .root.Values.clusterDomain -}}
{{- end -}}

{{/* --initial-cluster: every member's name and peer URL. */}}
{{- define "coordd.initialCluster" -}}
{{- $root := . -}}
{{- $members := list -}}
{{- range $i := until (int .Values.members) -}}
{{- $pod := printf "%s-%d" (include "coordd.fullname" $root) $i -}}
{{- $members = append $members (printf "%s=%s://%s:%d" $pod (include "coordd.peerScheme" $root) (include "coordd.peerHost" (dict "pod" $pod "root" $root)) (int $root.Values.ports.peer)) -}}
{{- end -}}
{{- join "," $members -}}
{{- end -}}

{{/* Host names browsers may use: the Services' names, and allowedHosts. */}}
{{- define "coordd.allowedHosts" -}}
{{- $ns := .Release.Namespace -}}
{{- $hosts := list -}}
{{- range $svc := list (include "coordd.fullname" .) (printf "%s-console" (include "coordd.fullname" .)) -}}
{{- $hosts = append $hosts $svc -}}
{{- $hosts = append $hosts (printf "%s.%s" $svc $ns) -}}
{{- $hosts = append $hosts (printf "%s.%s.svc" $svc $ns) -}}
{{- end -}}
{{- join "," (concat $hosts .Values.console.allowedHosts) -}}
{{- end -}}

{{/*
coordd.requireSecure fails the rendering of an open or plaintext cluster
unless insecure is set.
*/}}
{{- define "coordd.requireSecure" -}}
{{- if not .Values.insecure -}}
{{- $missing := list -}}
{{- if not .Values.tls.secretName -}}{{- $missing = append $missing "tls.secretName (the API over TLS)" -}}{{- end -}}
{{- if and (gt (int .Values.members) 1) (not .Values.peerTLS.secretName) -}}{{- $missing = append $missing "peerTLS.secretName (etcd's peer traffic over TLS)" -}}{{- end -}}
{{- if not .Values.auth.secretName -}}{{- $missing = append $missing "auth.secretName (a policy and tokens)" -}}{{- end -}}
{{- if $missing -}}
{{- fail (printf "coordd: refusing to render an open or plaintext cluster; set %s (see the chart's README), or set insecure: true to deploy it anyway" (join ", " $missing)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
