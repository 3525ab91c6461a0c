{{/* Names and labels shared by the templates. */}}

{{- define "mcad.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "mcad.controllerName" -}}
{{- printf "%s-controller" (include "mcad.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "mcad.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "mcad.labels" -}}
{{ include "mcad.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "mcad.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "mcad.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "mcad.hubName" -}}
{{- printf "%s-hub" (include "mcad.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The names of the Secrets holding the workers' kubeconfigs, one per line, after checking hub.config: the controller
reads them from the release namespace, and its Role names exactly these (an empty resourceNames would grant every
Secret). A worker with a kubeconfig file is refused: the chart mounts no such file.
*/}}
{{- define "mcad.hubSecrets" -}}
{{- $workers := .Values.hub.config.workers | default list -}}
{{- if not $workers -}}
{{- fail "hub.enabled needs at least one worker in hub.config.workers (each with secret.name: a Secret holding its kubeconfig)" -}}
{{- end -}}
{{- range $index, $worker := $workers -}}
{{- $name := $worker.name | default (printf "workers[%d]" $index) -}}
{{- if not ($worker.secret).name -}}
{{- fail (printf "hub.config.workers: %s needs secret.name: with the chart, a worker's kubeconfig comes from a Secret in the release namespace (a kubeconfig file is not mounted)" $name) -}}
{{- end -}}
{{- if and $worker.secret.namespace (ne $worker.secret.namespace $.Release.Namespace) -}}
{{- fail (printf "hub.config.workers: %s: secret.namespace %s is not the release namespace %s; the chart grants reading Secrets only there" $name $worker.secret.namespace $.Release.Namespace) -}}
{{- end -}}
{{ $worker.secret.name }}
{{ end -}}
{{- end -}}

{{/* The kinds the controller is granted (rbac.wrappedKinds + extraWrappedKinds) as resource.group, comma-separated:
     the default admission allowlist (--admission-allowed-kinds). */}}
{{- define "mcad.wrappedKindNames" -}}
{{- $names := list -}}
{{- range concat .Values.rbac.wrappedKinds .Values.rbac.extraWrappedKinds -}}
{{- $groups := .apiGroups -}}
{{- range $resource := .resources -}}
{{- range $group := $groups -}}
{{- $names = append $names (ternary $resource (printf "%s.%s" $resource $group) (eq $group "")) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- join "," (uniq $names) -}}
{{- end -}}

{{/*
"true" when the creator annotations (and the namespace's quota labels) are set by a MutatingAdmissionPolicy inside
the API server rather than by the controller's mutating webhook (values: webhook.creator).
*/}}
{{- define "mcad.creatorPolicy" -}}
{{- $creator := .Values.webhook.creator | default "webhook" -}}
{{- if not (has $creator (list "webhook" "policy")) -}}
{{- fail (printf "webhook.creator must be webhook or policy, not %q" $creator) -}}
{{- end -}}
{{- and .Values.webhook.enabled (eq $creator "policy") -}}
{{- end -}}
