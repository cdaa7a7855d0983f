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

{{- /* An image reference from (dict "image" <repository, tag, digest> "appVersion" …):
       the digest (sha256:…) pins the image and wins over the tag, which
       defaults to the chart's appVersion. */ -}}
{{- define "leasehold.imageRef" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .appVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{- /* The operator's image (every command). */ -}}
{{- define "leasehold.image" -}}
{{- include "leasehold.imageRef" (dict "image" .Values.image "appVersion" .Chart.AppVersion) -}}
{{- end -}}

{{- /* The image the webhook injects into candidate pods: sidecar.image when its
       repository is set (the Dockerfile's `sidecar` target, a pod's commands
       only), else the operator's image. */ -}}
{{- define "leasehold.sidecarImage" -}}
{{- if .Values.sidecar.image.repository -}}
{{- include "leasehold.imageRef" (dict "image" .Values.sidecar.image "appVersion" .Chart.AppVersion) -}}
{{- else -}}
{{- include "leasehold.image" . -}}
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
