{{/*
gpudra's alerting rules, one group; the PrometheusRule's spec. Every alert has a section of its name
in docs/troubleshooting.md ("Alerts"), linked by runbook_url; `promtool test rules` checks each
(tests/integration/test_monitoring.py). {{`…`}} keeps Prometheus's own templates out of Helm's.
*/}}
{{- define "gpudra.alertGroups" -}}
{{- $r := .Values.monitoring.rules }}
{{- $runbook := $r.runbookUrl }}
groups:
  - name: gpudra
    rules:
      - alert: GpudraPluginNotReady
        # Each failing check of /readyz is an alert of its own: the check says where to look.
        expr: gpudra_ready{daemon="kubelet-plugin"} == 0
        for: 10m
        labels:
          severity: warning
        annotations:
          summary: gpudra's kubelet plugin is not ready
          description: {{`'Plugin {{ $labels.pod }} on node {{ $labels.node }} has failed its readiness check {{ $labels.check }} for 10 minutes: claims on this node may not be prepared.'`}}
          runbook_url: {{ printf "%s#gpudrapluginnotready" $runbook }}
      - alert: GpudraCheckpointUnusable
        expr: gpudra_checkpoint_usable == 0
        for: 1m
        labels:
          severity: critical
        annotations:
          summary: gpudra's checkpoint cannot be used; every claim on the node is refused
          description: {{`'Plugin {{ $labels.pod }} on node {{ $labels.node }} cannot use its checkpoint and refuses every claim.'`}}
          runbook_url: {{ printf "%s#gpudracheckpointunusable" $runbook }}
      - alert: GpudraSliceSyncFailing
        expr: gpudra_background_healthy{loop="slice-sync"} == 0
        for: 15m
        labels:
          severity: warning
        annotations:
          summary: gpudra cannot keep the node's ResourceSlices current
          description: {{`'Plugin {{ $labels.pod }} on node {{ $labels.node }} has failed to write its ResourceSlices for 15 minutes: the scheduler sees an old picture of its GPUs.'`}}
          runbook_url: {{ printf "%s#gpudraslicesyncfailing" $runbook }}
      - alert: GpudraGpuUnhealthy
        expr: sum by (namespace, pod, node) (gpudra_tainted_devices) > 0
        for: 1m
        labels:
          severity: warning
        annotations:
          summary: GPUs are published tainted for their health
          description: {{`'{{ $value }} devices on node {{ $labels.node }} are tainted (a lost GPU, or an XID or ECC fault): new claims avoid them.'`}}
          runbook_url: {{ printf "%s#gpudragpuunhealthy" $runbook }}
      - alert: GpudraMpsDaemonRestartsFailing
        expr: increase(gpudra_mps_daemon_restarts_total{outcome="failed"}[15m]) > 0
        for: 5m
        labels:
          severity: warning
        annotations:
          summary: stopped MPS control daemons of prepared claims cannot be started again
          description: {{`'Plugin {{ $labels.pod }} on node {{ $labels.node }} failed to restart MPS control daemons {{ $value | humanize }} times in 15 minutes: the claims using them cannot run CUDA work.'`}}
          runbook_url: {{ printf "%s#gpudrampsdaemonrestartsfailing" $runbook }}
      - alert: GpudraAllocatedGpuIdle
        expr: max by (namespace, claim, node, device) (gpudra_claim_idle_seconds) > {{ int64 $r.idleAlertSeconds }}
        labels:
          severity: info
        annotations:
          summary: an allocated GPU has been idle for long
          description: {{ printf "'Claim {{ $labels.namespace }}/{{ $labels.claim }} has held device {{ $labels.device }} on node {{ $labels.node }} without activity for more than %d seconds.'" (int64 $r.idleAlertSeconds) }}
          runbook_url: {{ printf "%s#gpudraallocatedgpuidle" $runbook }}
      - alert: GpudraWebhookFailing
        # Errors answering (malformed reviews, failures of the webhook) or a webhook that cannot answer.
        expr: >-
          sum by (namespace, pod) (rate(gpudra_admission_reviews_total{result="error"}[10m])) > 0
          or gpudra_ready{daemon="controller", check="webhook"} == 0
        for: 10m
        labels:
          severity: warning
        annotations:
          summary: gpudra's admission webhook is failing
          description: {{`'Controller {{ $labels.pod }} has answered admission reviews with errors, or could not answer them, for 10 minutes: with failurePolicy Fail, claims with gpudra configs are refused.'`}}
          runbook_url: {{ printf "%s#gpudrawebhookfailing" $runbook }}
      - alert: GpudraNoLeader
        expr: >-
          max by (namespace) (gpudra_controller_leader) == 0
          {{- if .Values.controller.enabled }}
          or absent(gpudra_controller_leader)
          {{- end }}
        for: 5m
        labels:
          severity: warning
        annotations:
          summary: no gpudra controller leads
          description: {{`'No gpudra controller{{ with $labels.namespace }} in namespace {{ . }}{{ end }} has held the leader Lease for 5 minutes: webhook certificates are not renewed and per-claim artifacts are not cleaned up.'`}}
          runbook_url: {{ printf "%s#gpudranoleader" $runbook }}
{{- end -}}
