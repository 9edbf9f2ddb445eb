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
