{{/* An image reference: repository:tag. */}}
{{- define "flock.image" -}}
{{ .repository }}:{{ .tag }}
{{- end -}}

{{/* A value as text: numbers as integers (a values file's numbers are floats to Helm,
and 1000000 would otherwise print as 1e+06). */}}
{{- define "flock.text" -}}
{{- if kindIs "float64" . }}{{ int64 . }}{{ else }}{{ . }}{{ end -}}
{{- end -}}

{{/* An optional setting as an environment variable: emitted only when the value is set. */}}
{{- define "flock.env" -}}
{{- if not (kindIs "invalid" .value) }}
            - {name: {{ .name }}, value: {{ include "flock.text" .value | quote }}}
{{- end }}
{{- end -}}
