{{/* The coordinator image: repository and tag (default: the chart's appVersion). */}}
{{- define "bootc-fleet.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
