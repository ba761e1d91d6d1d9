package main

import (
	"strings"
	"testing"
)

const goodManifests = `
# Source: coordd/templates/service-peers.yaml
apiVersion: v1
kind: Service
metadata: {name: peers}
spec:
  clusterIP: None
  selector: {app: x}
  ports: [{name: peer, port: 7423, targetPort: peer}]
---
# Source: coordd/templates/service.yaml
apiVersion: v1
kind: Service
metadata: {name: api, labels: {app: x, part: api}}
spec:
  selector: {app: x}
  ports: [{name: http, port: 7421, targetPort: http}]
---
# Source: coordd/templates/statefulset.yaml
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: x}
spec:
  serviceName: peers
  selector: {matchLabels: {app: x}}
  template:
    metadata: {labels: {app: x}}
    spec:
      containers:
        - name: c
          image: c
          ports: [{name: http, containerPort: 7421}, {name: peer, containerPort: 7423}]
          readinessProbe: {httpGet: {path: /readyz, port: http}}
---
# Source: coordd/templates/pdb.yaml
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: x}
spec:
  maxUnavailable: 1
  selector: {matchLabels: {app: x}}
---
# Source: coordd/templates/servicemonitor.yaml
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: x}
spec:
  selector: {matchLabels: {part: api}}
  endpoints: [{port: http}]
---
# Source: coordd/templates/networkpolicy.yaml
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x}
spec:
  podSelector: {matchLabels: {app: x}}
  policyTypes: [Ingress]
  ingress:
    - from: [{podSelector: {matchLabels: {app: x}}}]
      ports: [{port: 7423, protocol: TCP}]
    - ports: [{port: 7421, protocol: TCP}]
---
# Source: coordd/templates/empty.yaml
# a template that rendered nothing
`

func check(t *testing.T, manifests string) error {
	t.Helper()
	objs, err := decodeAll(strings.NewReader(manifests))
	if err != nil {
		return err
	}
	for _, e := range crossCheck(objs) {
		return e
	}
	if len(objs) != 6 {
		t.Fatalf("%d objects decoded, want 6", len(objs))
	}
	return nil
}

func TestGoodManifestsPass(t *testing.T) {
	if err := check(t, goodManifests); err != nil {
		t.Fatal(err)
	}
}

// Each mistake of a chart that only a cluster would otherwise show.
func TestMistakesAreFound(t *testing.T) {
	for _, c := range []struct{ name, from, to, want string }{
		{"unknown field", "maxUnavailable: 1", "maxUnavailable: 1\n  maxUnavaliable: 1", `unknown field "spec.maxUnavaliable"`},
		{"wrong type", "containerPort: 7421", "containerPort: seventy", "containerPort"},
		{"unknown kind", "kind: PodDisruptionBudget", "kind: PodDisruptionBudgets", "no kind"},
		{"selector misses the pods", "selector: {matchLabels: {app: x}}\n  template", "selector: {matchLabels: {app: z}}\n  template", "does not match its pod labels"},
		{"probe port", "port: http}}", "port: https}}", `names port "https"`},
		{"service target port", "targetPort: peer}", "targetPort: peers}", `targetPort "peers"`},
		{"not headless", "clusterIP: None", "clusterIP: 10.0.0.1", "no headless Service"},
		{"monitor port", "endpoints: [{port: http}]", "endpoints: [{port: metrics}]", `port "metrics"`},
		{"network policy misses the pods", "podSelector: {matchLabels: {app: x}}\n  policyTypes", "podSelector: {matchLabels: {app: w}}\n  policyTypes", "NetworkPolicy x selects no pod"},
		{"network policy port", "ports: [{port: 7421, protocol: TCP}]", "ports: [{port: 7420, protocol: TCP}]", "NetworkPolicy x: port 7420"},
	} {
		t.Run(c.name, func(t *testing.T) {
			bad := strings.Replace(goodManifests, c.from, c.to, 1)
			if bad == goodManifests {
				t.Fatalf("%q is not in the manifests", c.from)
			}
			err := check(t, bad)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v, want one containing %q", err, c.want)
			}
		})
	}
}
