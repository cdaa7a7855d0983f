{{- /* The prefix of every object's name: fullnameOverride, else the release
       and the chart's name (nameOverride, else leasehold), once when the
       release already contains it. The app.kubernetes.io/name label stays
       "leasehold": `leasehold check` and `leasehold version` find installs by it. */ -}}
{{- define "leasehold.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "leasehold.labels" -}}
app.kubernetes.io/name: leasehold
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "leasehold.selectorLabels" -}}
app.kubernetes.io/name: leasehold
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "leasehold.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "leasehold.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- /* image.digest (sha256:…) pins the image and wins over the tag. */ -}}
{{- define "leasehold.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- /* This cluster's name: clusterName, else the deprecated operator.clusterName;
       two different names are refused rather than one silently winning. */ -}}
{{- define "leasehold.clusterName" -}}
{{- if and .Values.clusterName .Values.operator.clusterName (ne .Values.clusterName .Values.operator.clusterName) -}}
{{- fail (printf "clusterName %q and the deprecated operator.clusterName %q differ: set clusterName only" .Values.clusterName .Values.operator.clusterName) -}}
{{- end -}}
{{- default .Values.operator.clusterName .Values.clusterName -}}
{{- end -}}
