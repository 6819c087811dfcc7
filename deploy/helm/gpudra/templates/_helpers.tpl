{{/* Names. Every object is named after the release so two releases (two driver names) can coexist. */}}
{{- define "gpudra.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gpudra.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gpudra.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpudra.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "gpudra.pluginName" -}}{{ include "gpudra.fullname" . }}-kubelet-plugin{{- end -}}
{{- define "gpudra.mpsHostName" -}}{{ include "gpudra.fullname" . }}-mps-host{{- end -}}
{{/* mps-host's socket, in the plugin directory (mounted by the plugin and mps-host only). */}}
{{- define "gpudra.mpsHostSocket" -}}
{{- printf "%s/plugins/%s/mps-host/mps-host.sock" .Values.kubeletPlugin.kubeletDir .Values.driverName -}}
{{- end -}}
{{- define "gpudra.controllerName" -}}{{ include "gpudra.fullname" . }}-controller{{- end -}}

{{/* The plugin's service account as the API server names it (RBAC subjects, the policy's match). */}}
{{- define "gpudra.pluginUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "gpudra.pluginName" .) -}}
{{- end -}}

{{/*
`gpudra <command>` options as GPUDRA_<OPTION> variables: the keys of .options are the CLI options in
camelCase (values.schema.json lists them, generated from the CLI); null leaves the CLI's default.
*/}}
{{- define "gpudra.optionEnv" -}}
{{- range $key, $value := .options }}
{{- if not (kindIs "invalid" $value) }}
- name: GPUDRA_{{ snakecase $key | upper }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Pod and container hardening shared by both workloads; the plugin raises what it needs. */}}
{{- define "gpudra.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
