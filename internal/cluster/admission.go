package cluster

import "fmt"

// EventRateLimit returns Options that enable the EventRateLimit admission
// plugin with one token bucket per namespace: burst events at once, then qps
// events per second. Writes beyond that get 429 Too Many Requests.
func EventRateLimit(qps, burst int) Options {
	return Options{
		APIServerFlags: []string{"--enable-admission-plugins=EventRateLimit"},
		AdmissionConfig: fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: EventRateLimit
  configuration:
    apiVersion: eventratelimit.admission.k8s.io/v1alpha1
    kind: Configuration
    limits:
    - type: Namespace
      qps: %d
      burst: %d
      cacheSize: 100
`, qps, burst),
	}
}
