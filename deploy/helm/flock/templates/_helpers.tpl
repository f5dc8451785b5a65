{{/* An image reference: repository:tag. */}}
{{- define "flock.image" -}}
{{ .repository }}:{{ .tag }}
{{- end -}}

{{/* An optional setting as an environment variable: emitted only when the value is set. */}}
{{- define "flock.env" -}}
{{- if not (kindIs "invalid" .value) }}
            - {name: {{ .name }}, value: {{ .value | toString | quote }}}
{{- end }}
{{- end -}}
