{{/* The alert rules (Prometheus rule groups), for this release's series only: each selector is
limited to namespace=<release namespace>, release=<release name> (labels the ServiceMonitor sets),
so that two releases each alert on their own run. Thresholds come from metrics.alerts. */}}
{{- define "magic.alertRules" -}}
{{- $a := .Values.metrics.alerts }}
{{- $sel := printf "namespace=%q, release=%q" .Release.Namespace .Release.Name }}
{{- $by := "namespace, release" }}
groups:
  - name: magic-training
    rules:
      - alert: MagicEntropyCollapse
        expr: magic_policy_entropy{component="learner", {{ $sel }}} < {{ $a.entropyCollapse.ratio }} * magic_entropy_target{component="learner", {{ $sel }}}
        for: {{ $a.entropyCollapse.for }}
        labels:
          severity: warning
        annotations:
          summary: Policy entropy collapsed below {{ $a.entropyCollapse.ratio }} x its target
          description: >-
            Release {{ "{{" }} $labels.release {{ "}}" }}: the policy's entropy over the rollout batch is
            {{ "{{" }} $value | printf "%.3g" {{ "}}" }} nats, under {{ $a.entropyCollapse.ratio }} x the stage's
            target tgt_ent, for {{ $a.entropyCollapse.for }}. Adaptive entropy control is not holding it:
            check magic_entropy_coef (stuck at its bound?) and the learning rate.
      - alert: MagicClipRatioRunaway
        expr: magic_response_clip_ratio{component="learner", {{ $sel }}} > {{ $a.clipRatioRunaway.threshold }}
        for: {{ $a.clipRatioRunaway.for }}
        labels:
          severity: warning
        annotations:
          summary: Over {{ $a.clipRatioRunaway.threshold }} of the responses are truncated at T
          description: >-
            Release {{ "{{" }} $labels.release {{ "}}" }}: {{ "{{" }} $value | humanizePercentage {{ "}}" }} of the
            responses hit the context length T for {{ $a.clipRatioRunaway.for }}. Move to the next stage
            (longer T) or check for repetition.
  - name: magic-operations
    rules:
      - alert: MagicNoStep
        expr: >-
          (max by ({{ $by }}) (changes(magic_step{component="controller", {{ $sel }}}[{{ $a.noStep.for }}])) == 0)
          and on ({{ $by }})
          (max by ({{ $by }}) (magic_step{component="controller", {{ $sel }}} offset {{ $a.noStep.for }}))
          and on ({{ $by }})
          (sum by ({{ $by }}) (magic_stream_lag{component="controller", stream=~"prompts|rollouts|scored", {{ $sel }}}
            + magic_stream_pending{component="controller", stream=~"prompts|rollouts|scored", {{ $sel }}}) > 0)
        labels:
          severity: critical
        annotations:
          summary: No training step for {{ $a.noStep.for }} while work is waiting
          description: >-
            Release {{ "{{" }} $labels.release {{ "}}" }}: the step counter has not moved for {{ $a.noStep.for }}
            though {{ "{{" }} $value {{ "}}" }} stream entries are waiting. Check that the rollout, reward and
            learner workers are alive (magic_live_workers) and their logs.
      - alert: MagicDeadLetters
        expr: sum by ({{ $by }}, stream) (increase(magic_dead_letters_total{ {{- $sel -}} }[{{ $a.deadLetters.window }}])) > 0
        labels:
          severity: warning
        annotations:
          summary: Stream entries were moved to the dead-letter stream
          description: >-
            Release {{ "{{" }} $labels.release {{ "}}" }}: {{ "{{" }} $value | printf "%.0f" {{ "}}" }} entries of stream
            {{ "{{" }} $labels.stream {{ "}}" }} were dead-lettered in the last {{ $a.deadLetters.window }} (poison
            messages): read them with XRANGE magic:{<run>}:dead.
      - alert: MagicRewardTimeouts
        expr: >-
          sum by ({{ $by }}, kind) (rate(magic_reward_timeouts_total{component="reward", {{ $sel }}}[{{ $a.rewardTimeouts.window }}]))
          / sum by ({{ $by }}, kind) (rate(magic_reward_verdicts_total{component="reward", {{ $sel }}}[{{ $a.rewardTimeouts.window }}]))
          > {{ $a.rewardTimeouts.ratio }}
        for: {{ $a.rewardTimeouts.for }}
        labels:
          severity: warning
        annotations:
          summary: Over {{ $a.rewardTimeouts.ratio }} of the {{ "{{" }} $labels.kind {{ "}}" }} responses time out in the verifier
          description: >-
            Release {{ "{{" }} $labels.release {{ "}}" }}: {{ "{{" }} $value | humanizePercentage {{ "}}" }} of the
            {{ "{{" }} $labels.kind {{ "}}" }} responses hit a verifier or sandbox time limit. Add reward pods or CPU,
            or raise the time limits.
{{- end }}

{{/* PrometheusRule on, off or auto-detected */}}
{{- define "magic.prometheusRuleEnabled" -}}
{{- $on := toString .Values.metrics.alerts.enabled }}
{{- if or (eq $on "true") (and (eq $on "auto") (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PrometheusRule")) }}true{{ end }}
{{- end }}
