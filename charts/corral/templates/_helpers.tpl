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

{{- define "corral.memorySelector" -}}
app.kubernetes.io/name: corral-memory
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

{{/*
The oldest Kubernetes the chart supports. Not Chart.yaml's kubeVersion: `helm template` checks
that against its own default capabilities (v1.20.0 in a helm built without its release
ldflags, its client-go's version in a release build), so a render without a cluster would fail
or pass by how helm was built. The check runs where a cluster answers: `lookup` finds
kube-system on `helm install`/`upgrade` (and `--dry-run=server`), and nothing on `helm template`
or `helm lint`, whose output is applied, and so checked, elsewhere.
*/}}
{{- define "corral.minKubeVersion" -}}1.33.0{{- end }}

{{/* (dict "version" VERSION "cluster" BOOL): fails naming the cluster's version and the minimum. */}}
{{- define "corral.requireKubeVersion" -}}
{{- $min := include "corral.minKubeVersion" . -}}
{{- if and .cluster (not (semverCompare (printf ">=%s-0" $min) .version)) -}}
{{- fail (printf "this cluster runs Kubernetes %s; Corral's chart needs %s or later (the oldest it is built and tested for)" .version $min) -}}
{{- end -}}
{{- end }}

{{- define "corral.kubeVersionCheck" -}}
{{- $version := .Capabilities.KubeVersion.Version -}}
{{- $cluster := false -}}
{{- if not (semverCompare (printf ">=%s-0" (include "corral.minKubeVersion" .)) $version) -}}
{{- /* Asked only when the version is too old: a supported cluster costs no extra request. */ -}}
{{- $cluster = not (empty (lookup "v1" "Namespace" "" "kube-system")) -}}
{{- end -}}
{{- include "corral.requireKubeVersion" (dict "version" $version "cluster" $cluster) -}}
{{- end }}

{{/*
A pod template's metadata: the component's selector labels (which its podLabels cannot
override: the schema refuses those keys, and merge keeps the selector's), then its podLabels
and podAnnotations. (dict "selector" (include ...) "values" COMPONENT-VALUES)
*/}}
{{- define "corral.podMetadata" -}}
labels:
  {{- toYaml (merge (fromYaml .selector) (.values.podLabels | default dict)) | nindent 2 }}
{{- with .values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Where a pod runs and how its images are pulled: (dict "values" COMPONENT-VALUES "pullSecrets"
LIST "affinity" DEFAULT-AFFINITY). The component's own affinity replaces the default.
*/}}
{{- define "corral.podPlacement" -}}
{{- with .pullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (.values.affinity | default .affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
