{{/*
Public templates, for your own chart (this chart as a dependency) or for this chart's example:

  pulse-sidecar.container                      the sidecar container, one list item for containers:
                                               (or initContainers: when nativeSidecar is true)
  pulse-sidecar.volumes                        the volumes it mounts, list items for volumes:
  pulse-sidecar.terminationGracePeriodSeconds  the pod's grace period, checked against shutdownTimeout
  pulse-sidecar.podAnnotations                 checksum annotations, so pods restart when endpoints change
  pulse-sidecar.fullname                       the prefix of the ConfigMap and Secret names

Each takes the root context ($) of either chart. From a parent chart the sidecar's values are read under the
"pulse-sidecar" key (the dependency's name); with an alias, pass (dict "Values" .Values.<alias> "Release" .Release).
Names derive from the release, not from .Chart, so a parent chart computes the same names as this chart.
*/}}

{{/* pulse-sidecar.x.fullname expects dict {v, Release}. */}}
{{- define "pulse-sidecar.x.fullname" -}}
{{- $v := .v -}}
{{- if $v.fullnameOverride -}}
{{- $v.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default "pulse-sidecar" $v.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "pulse-sidecar.x.secretName" -}}
{{- default (include "pulse-sidecar.x.fullname" .) .v.secret.existingSecret -}}
{{- end -}}

{{- define "pulse-sidecar.x.configMapName" -}}
{{- printf "%s-endpoints" (include "pulse-sidecar.x.fullname" . | trunc 53 | trimSuffix "-") -}}
{{- end -}}

{{- define "pulse-sidecar.x.image" -}}
{{- $img := .image -}}
{{- if not $img.repository -}}{{- fail "pulse-sidecar: image.repository is required" -}}{{- end -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- if not $img.tag -}}{{- fail "pulse-sidecar: image.tag (or image.digest) is required" -}}{{- end -}}
{{- printf "%s:%s" $img.repository (toString $img.tag) -}}
{{- end -}}
{{- end -}}

{{/* pulse-sidecar.x.seconds turns a Go duration ("25s", "1m30s", "500ms") into seconds; fails on anything else. */}}
{{- define "pulse-sidecar.x.seconds" -}}
{{- $d := toString . | trim -}}
{{- $term := `([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h)` -}}
{{- if eq $d "0" -}}
0
{{- else -}}
{{- if not (regexMatch (printf "^(%s)+$" $term) $d) -}}
{{- fail (printf "pulse-sidecar: shutdownTimeout %q is not a Go duration such as 25s or 1m30s" $d) -}}
{{- end -}}
{{- $units := dict "h" 3600.0 "m" 60.0 "s" 1.0 "ms" 0.001 "us" 0.000001 "µs" 0.000001 "ns" 0.000000001 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll $term $d -1 -}}
{{- $num := regexFind `^[0-9.]+` . -}}
{{- $total = addf $total (mulf (float64 $num) (index $units (trimPrefix $num .))) -}}
{{- end -}}
{{- $total -}}
{{- end -}}
{{- end -}}

{{/* pulse-sidecar.x.schemaSeconds renders the values' schemaTimeout (a Go duration, default 1h) in seconds. */}}
{{- define "pulse-sidecar.x.schemaSeconds" -}}
{{- $d := toString (default "1h" .schemaTimeout) | trim -}}
{{- if not (regexMatch `^(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h))+$` $d) -}}
{{- fail (printf "pulse-sidecar: schemaTimeout %q is not a Go duration such as 1h or 90m" $d) -}}
{{- end -}}
{{- include "pulse-sidecar.x.seconds" $d -}}
{{- end -}}

{{/* pulse-sidecar.x.loopback renders "true" when the values' listenAddress is a loopback address. */}}
{{- define "pulse-sidecar.x.loopback" -}}
{{- $a := toString (default "127.0.0.1" .listenAddress) -}}
{{- if or (hasPrefix "127." $a) (eq $a "::1") (eq $a "[::1]") (eq $a "localhost") -}}true{{- end -}}
{{- end -}}

{{/* pulse-sidecar.x.validate expects dict {v, Release}; it renders nothing or fails with a message. */}}
{{- define "pulse-sidecar.x.validate" -}}
{{- $v := .v -}}
{{- $shutdown := include "pulse-sidecar.x.seconds" (default "25s" $v.shutdownTimeout) | float64 -}}
{{- $grace := $v.terminationGracePeriodSeconds | float64 -}}
{{- if le $grace $shutdown -}}
{{- fail (printf "pulse-sidecar: terminationGracePeriodSeconds (%v) must be greater than shutdownTimeout (%s = %vs), or in-flight deliveries are killed before they finish" $v.terminationGracePeriodSeconds (toString $v.shutdownTimeout) $shutdown) -}}
{{- end -}}
{{- $schema := include "pulse-sidecar.x.schemaSeconds" $v | float64 -}}
{{- if or (lt $schema 60.0) (gt $schema 172800.0) -}}
{{- fail (printf "pulse-sidecar: schemaTimeout %q is outside 1m to 48h (PULSE_SCHEMA_TIMEOUT's range)" (toString $v.schemaTimeout)) -}}
{{- end -}}
{{- if and (not $v.secret.existingSecret) (not $v.secret.create) -}}
{{- fail "pulse-sidecar: set secret.existingSecret to a Secret holding the MongoDB URI, or secret.create=true" -}}
{{- end -}}
{{- if not $v.secret.mongodbUriKey -}}
{{- fail "pulse-sidecar: secret.mongodbUriKey must name the Secret key holding the MongoDB URI" -}}
{{- end -}}
{{- if and (not $v.secret.existingSecret) (not $v.secret.mongodbUri) (not $v.devDatabase) -}}
{{- fail "pulse-sidecar: no MongoDB URI: set secret.mongodbUri, or secret.existingSecret (a Secret holding the URI under secret.mongodbUriKey); or set devDatabase=true to run the embedded development database inside the pod (emptyDir: data lost with the pod, development only)" -}}
{{- end -}}
{{- range $k := list "portName" "probePortName" -}}
{{- if gt (len (toString (index $v $k))) 15 -}}
{{- fail (printf "pulse-sidecar: %s %q is longer than 15 characters" $k (toString (index $v $k))) -}}
{{- end -}}
{{- end -}}
{{- if eq (int $v.port) (int $v.probePort) -}}
{{- fail (printf "pulse-sidecar: port and probePort are both %d; the API and the probes need a port each" (int $v.port)) -}}
{{- end -}}
{{- if and (not (include "pulse-sidecar.x.loopback" $v)) $v.secret.create (not $v.secret.existingSecret) (not $v.secret.apiToken) -}}
{{- fail (printf "pulse-sidecar: listenAddress %s exposes the API beyond the pod's loopback without a token; set secret.apiToken (or secret.existingSecret with the key secret.apiTokenKey), or keep listenAddress 127.0.0.1" (toString $v.listenAddress)) -}}
{{- end -}}
{{- $known := list "database" "collectionPrefix" "lockTimeout" "pollInterval" "changeStreams" "eventRetention" "historyRetention" "logLevel" "logFormat" -}}
{{- range $k, $_ := $v.config -}}
{{- if not (has $k $known) -}}
{{- fail (printf "pulse-sidecar: unknown config.%s (known: %s)" $k (join ", " $known)) -}}
{{- end -}}
{{- end -}}
{{- $owned := list "PULSE_LISTEN" "PULSE_PROBE_LISTEN" "PULSE_DATA_DIR" "PULSE_SHUTDOWN_TIMEOUT" "PULSE_SCHEMA_TIMEOUT" "PULSE_MONGODB_URI" "PULSE_API_TOKEN" "PULSE_API_READ_TOKEN" "PULSE_ENCRYPTION_KEY" "PULSE_ENDPOINTS_FILE" -}}
{{- range $v.extraEnv -}}
{{- if has .name $owned -}}
{{- fail (printf "pulse-sidecar: extraEnv sets %s, which the chart sets itself (use port, shutdownTimeout, schemaTimeout, secret or endpoints)" .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* pulse-sidecar.container: the sidecar container as one list item. */}}
{{- define "pulse-sidecar.container" -}}
{{- $v := .Values -}}
{{- if hasKey .Values "pulse-sidecar" -}}{{- $v = index .Values "pulse-sidecar" -}}{{- end -}}
{{- $c := dict "v" $v "Release" .Release -}}
{{- include "pulse-sidecar.x.validate" $c -}}
{{- $secret := include "pulse-sidecar.x.secretName" $c -}}
- name: {{ $v.containerName | default "pulse" }}
  image: {{ include "pulse-sidecar.x.image" $v | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy | default "IfNotPresent" }}
  {{- if $v.nativeSidecar }}
  restartPolicy: Always
  {{- end }}
  args: ["serve"]
  ports:
    - name: {{ $v.probePortName }}
      containerPort: {{ int $v.probePort }}
      protocol: TCP
    {{- if not (include "pulse-sidecar.x.loopback" $v) }}
    - name: {{ $v.portName }}
      containerPort: {{ int $v.port }}
      protocol: TCP
    {{- end }}
  env:
    - name: PULSE_LISTEN
      value: {{ printf "%s:%d" (toString (default "127.0.0.1" $v.listenAddress)) (int $v.port) | quote }}
    - name: PULSE_PROBE_LISTEN
      value: {{ printf "0.0.0.0:%d" (int $v.probePort) | quote }}
    - name: PULSE_DATA_DIR
      value: /data
    - name: PULSE_SHUTDOWN_TIMEOUT
      value: {{ default "25s" $v.shutdownTimeout | toString | quote }}
    - name: PULSE_SCHEMA_TIMEOUT
      value: {{ default "1h" $v.schemaTimeout | toString | quote }}
    - name: PULSE_MONGODB_URI
      valueFrom:
        secretKeyRef:
          name: {{ $secret }}
          key: {{ $v.secret.mongodbUriKey }}
    {{- if $v.secret.apiTokenKey }}
    - name: PULSE_API_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ $secret }}
          key: {{ $v.secret.apiTokenKey }}
          optional: true
    {{- end }}
    {{- if $v.secret.apiReadTokenKey }}
    - name: PULSE_API_READ_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ $secret }}
          key: {{ $v.secret.apiReadTokenKey }}
          optional: true
    {{- end }}
    {{- if $v.secret.encryptionKeyKey }}
    - name: PULSE_ENCRYPTION_KEY
      valueFrom:
        secretKeyRef:
          name: {{ $secret }}
          key: {{ $v.secret.encryptionKeyKey }}
          optional: true
    {{- end }}
    {{- if $v.endpoints }}
    - name: PULSE_ENDPOINTS_FILE
      value: /config/endpoints.yaml
    {{- end }}
    {{- range $k := list "database" "collectionPrefix" "lockTimeout" "pollInterval" "changeStreams" "eventRetention" "historyRetention" "logLevel" "logFormat" }}
    {{- $val := index ($v.config | default dict) $k }}
    {{- if and (not (kindIs "invalid" $val)) (ne (toString $val) "") }}
    - name: {{ printf "PULSE_%s" (snakecase $k | upper) }}
      value: {{ toString $val | quote }}
    {{- end }}
    {{- end }}
    {{- with $v.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- /* The whole start: the schema work (schemaTimeout), the 30 s bound of the start's work after it, a
  minute of margin. /healthz answers during the start; /readyz answers 200 once it is over. */}}
  {{- $sp := omit ($v.startupProbe | default dict) "httpGet" }}
  {{- $period := int (default 10 $sp.periodSeconds) }}
  {{- $schema := include "pulse-sidecar.x.schemaSeconds" $v | float64 }}
  startupProbe:
    httpGet:
      path: {{ dig "httpGet" "path" "/readyz" ($v.startupProbe | default dict) }}
      port: {{ $v.probePortName }}
    periodSeconds: {{ $period }}
    failureThreshold: {{ $sp.failureThreshold | default (ceil (divf (addf $schema 90.0) (float64 $period)) | int) }}
    {{- with omit $sp "periodSeconds" "failureThreshold" }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  readinessProbe:
    httpGet:
      path: {{ dig "httpGet" "path" "/readyz" ($v.readinessProbe | default dict) }}
      port: {{ $v.probePortName }}
    {{- with omit ($v.readinessProbe | default dict) "httpGet" }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  livenessProbe:
    httpGet:
      path: {{ dig "httpGet" "path" "/healthz" ($v.livenessProbe | default dict) }}
      port: {{ $v.probePortName }}
    {{- with omit ($v.livenessProbe | default dict) "httpGet" }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $v.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $v.securityContext | nindent 4 }}
  volumeMounts:
    - name: pulse-tmp
      mountPath: /tmp
    - name: pulse-data
      mountPath: /data
    {{- if $v.endpoints }}
    - name: pulse-endpoints
      mountPath: /config
      readOnly: true
    {{- end }}
    {{- with $v.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{/* pulse-sidecar.volumes: the volumes the sidecar container mounts, as list items. */}}
{{- define "pulse-sidecar.volumes" -}}
{{- $v := .Values -}}
{{- if hasKey .Values "pulse-sidecar" -}}{{- $v = index .Values "pulse-sidecar" -}}{{- end -}}
{{- $c := dict "v" $v "Release" .Release -}}
- name: pulse-tmp
  emptyDir:
    {{- with $v.emptyDirSizeLimit }}
    sizeLimit: {{ . }}
    {{- else }} {}
    {{- end }}
- name: pulse-data
  emptyDir:
    {{- with $v.emptyDirSizeLimit }}
    sizeLimit: {{ . }}
    {{- else }} {}
    {{- end }}
{{- if $v.endpoints }}
- name: pulse-endpoints
  configMap:
    name: {{ include "pulse-sidecar.x.configMapName" $c }}
{{- end }}
{{- end -}}

{{/* pulse-sidecar.terminationGracePeriodSeconds: the grace period, after checking it exceeds shutdownTimeout. */}}
{{- define "pulse-sidecar.terminationGracePeriodSeconds" -}}
{{- $v := .Values -}}
{{- if hasKey .Values "pulse-sidecar" -}}{{- $v = index .Values "pulse-sidecar" -}}{{- end -}}
{{- include "pulse-sidecar.x.validate" (dict "v" $v "Release" .Release) -}}
{{- int $v.terminationGracePeriodSeconds -}}
{{- end -}}

{{/* pulse-sidecar.podAnnotations: checksums of the endpoints file and of the created Secret's values. */}}
{{- define "pulse-sidecar.podAnnotations" -}}
{{- $v := .Values -}}
{{- if hasKey .Values "pulse-sidecar" -}}{{- $v = index .Values "pulse-sidecar" -}}{{- end -}}
checksum/pulse-endpoints: {{ toYaml ($v.endpoints | default list) | sha256sum }}
checksum/pulse-secret: {{ toYaml $v.secret | sha256sum }}
{{- end -}}

{{- define "pulse-sidecar.fullname" -}}
{{- $v := .Values -}}
{{- if hasKey .Values "pulse-sidecar" -}}{{- $v = index .Values "pulse-sidecar" -}}{{- end -}}
{{- include "pulse-sidecar.x.fullname" (dict "v" $v "Release" .Release) -}}
{{- end -}}

{{/* The rest serves this chart's own resources only (it reads .Chart). */}}
{{- define "pulse-sidecar.name" -}}
{{- default "pulse-sidecar" .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pulse-sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pulse-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "pulse-sidecar.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "pulse-sidecar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | toString | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Pod labels of the example Deployment. */}}
{{- define "pulse-sidecar.exampleSelectorLabels" -}}
{{ include "pulse-sidecar.selectorLabels" . }}
app.kubernetes.io/component: example
{{- end -}}
