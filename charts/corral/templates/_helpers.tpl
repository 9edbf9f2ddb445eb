{{- define "corral.labels" -}}
app.kubernetes.io/part-of: corral
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{- define "corral.operatorSelector" -}}
app.kubernetes.io/name: corral-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The egress gateway (docs/egress.md): its Deployment, Service and ServiceAccount's name. */}}
{{- define "corral.egressGatewayName" -}}
{{- printf "%s-egress-gateway" .Release.Name -}}
{{- end }}

{{- define "corral.egressBindingKeySecret" -}}
{{- printf "%s-egress-binding-key" .Release.Name -}}
{{- end }}

{{- define "corral.egressGatewaySelector" -}}
app.kubernetes.io/name: corral-egress-gateway
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "corral.sandboxNamespaces" -}}
{{- $ns := .Values.sandboxNamespaces | default .Values.watchNamespaces -}}
{{- if not $ns -}}
{{- fail "set watchNamespaces (the namespaces where Sessions run), or sandboxNamespaces when watchNamespaces is empty: no namespace would get the sandbox's ServiceAccount and Role" -}}
{{- end -}}
{{- toJson $ns -}}
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

{{/*
Values an older chart took that the egress gateway replaced: an install that still sets one
stops, naming what took its place, rather than silently ignoring it. The schema lets them
through only so that this message, not "additional properties not allowed", is what is read.
*/}}
{{- define "corral.removedValues" -}}
{{- $sandbox := .Values.sandbox | default dict -}}
{{- $removed := dict
    "apiServerEgress" "the custodian reaches the API server through the egress gateway (docs/egress.md)"
    "allowDnsEgress" "sandboxes have no DNS; the egress gateway resolves names for them (docs/egress.md)"
    "dnsNamespace" "sandboxes have no DNS; the egress gateway resolves names for them (docs/egress.md)"
    "dnsPodLabels" "sandboxes have no DNS; the egress gateway resolves names for them (docs/egress.md)"
-}}
{{- range $key := keys $removed | sortAlpha -}}
{{- if hasKey $sandbox $key -}}
{{- fail (printf "sandbox.%s was removed: %s" $key (get $removed $key)) -}}
{{- end -}}
{{- end -}}
{{- end }}
