{{- define "corral.labels" -}}
app.kubernetes.io/part-of: corral
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{- define "corral.operatorSelector" -}}
app.kubernetes.io/name: corral-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "corral.sandboxNamespaces" -}}
{{- $ns := .Values.sandboxNamespaces | default .Values.watchNamespaces -}}
{{- if not $ns -}}
{{- fail "set watchNamespaces (the namespaces where Sessions run), or sandboxNamespaces when watchNamespaces is empty: no namespace would get the sandbox's ServiceAccount and Role" -}}
{{- end -}}
{{- toJson $ns -}}
{{- end }}

{{/*
The API server's addresses as `--platform-egress` arguments, from the `kubernetes` Service's
EndpointSlices (looked up at install/upgrade; `helm template` finds none and adds nothing).
An endpoint is what a sandbox's packets are addressed to once the Service is translated, and so
what its NetworkPolicy must allow.
*/}}
{{- define "corral.apiServerEgress" -}}
{{- if .Values.sandbox.apiServerEgress -}}
{{- $slices := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "" -}}
{{- range $slice := (dig "items" list ($slices | default dict)) -}}
{{- if eq (dig "metadata" "labels" "kubernetes.io/service-name" "" $slice) "kubernetes" -}}
{{- $ports := list -}}
{{- range $port := (dig "ports" list $slice) -}}
{{- $ports = append $ports (toString (get $port "port")) -}}
{{- end -}}
{{- range $endpoint := (dig "endpoints" list $slice) -}}
{{- range $address := (dig "addresses" list $endpoint) -}}
{{- if contains ":" $address }}
- --platform-egress={{ $address }}/128
{{- else }}
- --platform-egress={{ $address }}/32{{ if $ports }}:{{ join "," $ports }}{{ end }}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}

{{- define "corral.restrictedContainer" -}}
runAsNonRoot: true
runAsUser: {{ .Values.operator.runAsUser }}
runAsGroup: {{ .Values.operator.runAsUser }}
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The Secret holding the memory store's `dsn` (docs/memory.md), or nothing. */}}
{{- define "corral.memorySecret" -}}
{{- if .Values.memory.postgres.existingSecret -}}
{{- .Values.memory.postgres.existingSecret -}}
{{- else if .Values.memory.postgres.deploy -}}
{{- printf "%s-memory" .Release.Name -}}
{{- end -}}
{{- end }}
