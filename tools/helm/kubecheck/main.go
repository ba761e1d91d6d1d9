// Command kubecheck checks Kubernetes manifests (helm template's output, on
// stdin or in the files named) against the Kubernetes API's own types:
// every document must be a kind it knows (core, apps, policy, and the
// Prometheus operator's ServiceMonitor), decoded strictly (an unknown or
// duplicated field, or a value of the wrong type, is an error), and the
// objects must agree with each other where a mistake would only show in a
// cluster: a workload's selector matches its pod labels, a Service's or
// probe's named port exists, a StatefulSet's serviceName is a headless
// Service of the same manifests, a PodDisruptionBudget selects pods.
//
// It checks what the API server's decoding would refuse and what this
// chart could get wrong; it is not the API server's whole validation.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

func main() {
	var inputs []io.Reader
	for _, f := range os.Args[1:] {
		fh, err := os.Open(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, "kubecheck:", err)
			os.Exit(2)
		}
		defer func() { _ = fh.Close() }()
		inputs = append(inputs, fh)
	}
	if len(inputs) == 0 {
		inputs = append(inputs, os.Stdin)
	}
	var objs []runtime.Object
	var errs []error
	for _, in := range inputs {
		o, err := decodeAll(in)
		objs = append(objs, o...)
		errs = append(errs, err)
	}
	errs = append(errs, crossCheck(objs)...)
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(os.Stderr, "kubecheck:", err)
		os.Exit(1)
	}
	fmt.Printf("kubecheck: %d objects valid\n", len(objs))
}

// decodeAll decodes every YAML document of r strictly.
func decodeAll(r io.Reader) ([]runtime.Object, error) {
	s := runtime.NewScheme()
	if err := scheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := monitoringv1.AddToScheme(s); err != nil {
		return nil, err
	}
	dec := serializer.NewCodecFactory(s, serializer.EnableStrict).UniversalDeserializer()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var out []runtime.Object
	var errs []error
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return out, errors.Join(errs...)
		}
		if err != nil {
			return out, err
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		obj, _, err := dec.Decode(doc, nil, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", firstSource(doc), err))
			continue
		}
		out = append(out, obj)
	}
}

// stripComments drops comment lines, so a document of comments alone
// (a template that rendered nothing) is skipped.
func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, line := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.Bytes()
}

// firstSource is helm's "# Source: chart/templates/x.yaml" line, to name
// the template a bad document came from.
func firstSource(doc []byte) string {
	for _, line := range strings.Split(string(doc), "\n") {
		if rest, ok := strings.CutPrefix(line, "# Source: "); ok {
			return rest
		}
	}
	return "a document"
}

// crossCheck checks what no single object's decoding can.
func crossCheck(objs []runtime.Object) []error {
	var errs []error
	services := map[string]*corev1.Service{}
	var pods []podSpec
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.Service:
			services[o.Name] = o
		case *appsv1.StatefulSet:
			pods = append(pods, podSpec{"StatefulSet " + o.Name, o.Spec.Template})
			errs = append(errs, selects("StatefulSet "+o.Name, o.Spec.Selector.MatchLabels, o.Spec.Template.Labels)...)
		case *appsv1.Deployment:
			pods = append(pods, podSpec{"Deployment " + o.Name, o.Spec.Template})
			errs = append(errs, selects("Deployment "+o.Name, o.Spec.Selector.MatchLabels, o.Spec.Template.Labels)...)
		}
	}
	for _, p := range pods {
		errs = append(errs, probePorts(p)...)
	}
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.StatefulSet:
			svc, ok := services[o.Spec.ServiceName]
			if !ok || svc.Spec.ClusterIP != corev1.ClusterIPNone {
				errs = append(errs, fmt.Errorf("StatefulSet %s: serviceName %q is no headless Service of these manifests", o.Name, o.Spec.ServiceName))
			}
		case *corev1.Service:
			errs = append(errs, servicePorts(o, pods)...)
		case *policyv1.PodDisruptionBudget:
			if !selectsAny(o.Spec.Selector.MatchLabels, pods) {
				errs = append(errs, fmt.Errorf("PodDisruptionBudget %s selects no pod of these manifests", o.Name))
			}
		case *monitoringv1.ServiceMonitor:
			errs = append(errs, monitorPorts(o, services)...)
		case *networkingv1.NetworkPolicy:
			errs = append(errs, policyPorts(o, pods)...)
		}
	}
	return errs
}

// policyPorts checks that a NetworkPolicy selects pods of these manifests
// and admits only ports they have (a port by number or by name): a policy
// that selects nothing protects nothing, and one whose port is no
// container's blocks that traffic without saying so.
func policyPorts(np *networkingv1.NetworkPolicy, pods []podSpec) []error {
	var matched []podSpec
	for _, p := range pods {
		if len(np.Spec.PodSelector.MatchLabels) > 0 && labels.SelectorFromSet(np.Spec.PodSelector.MatchLabels).Matches(labels.Set(p.tmpl.Labels)) {
			matched = append(matched, p)
		}
	}
	if len(matched) == 0 {
		return []error{fmt.Errorf("NetworkPolicy %s selects no pod of these manifests", np.Name)}
	}
	var errs []error
	for _, rule := range np.Spec.Ingress {
		for _, port := range rule.Ports {
			if port.Port == nil {
				continue
			}
			for _, p := range matched {
				if !hasContainerPort(p, port.Port.IntVal, port.Port.StrVal) {
					errs = append(errs, fmt.Errorf("NetworkPolicy %s: port %s is no port of %s", np.Name, port.Port.String(), p.owner))
				}
			}
		}
	}
	return errs
}

// hasContainerPort reports whether a container of p has the port number
// (or, when name is set, the port name).
func hasContainerPort(p podSpec, number int32, name string) bool {
	for _, c := range p.tmpl.Spec.Containers {
		for _, cp := range c.Ports {
			if name != "" && cp.Name == name || name == "" && cp.ContainerPort == number {
				return true
			}
		}
	}
	return false
}

type podSpec struct {
	owner string
	tmpl  corev1.PodTemplateSpec
}

func selects(owner string, selector, podLabels map[string]string) []error {
	if len(selector) == 0 || !labels.SelectorFromSet(selector).Matches(labels.Set(podLabels)) {
		return []error{fmt.Errorf("%s: selector %v does not match its pod labels %v", owner, selector, podLabels)}
	}
	return nil
}

func selectsAny(selector map[string]string, pods []podSpec) bool {
	for _, p := range pods {
		if len(selector) > 0 && labels.SelectorFromSet(selector).Matches(labels.Set(p.tmpl.Labels)) {
			return true
		}
	}
	return false
}

// hasPort reports whether a container of the pod declares the named port.
func hasPort(p podSpec, name string) bool {
	for _, c := range p.tmpl.Spec.Containers {
		for _, port := range c.Ports {
			if port.Name == name {
				return true
			}
		}
	}
	return false
}

func probePorts(p podSpec) []error {
	var errs []error
	for _, c := range p.tmpl.Spec.Containers {
		for what, pr := range map[string]*corev1.Probe{"startupProbe": c.StartupProbe, "readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
			if pr == nil {
				continue
			}
			var port string
			switch {
			case pr.HTTPGet != nil:
				port = pr.HTTPGet.Port.StrVal
			case pr.TCPSocket != nil:
				port = pr.TCPSocket.Port.StrVal
			}
			if port != "" && !hasPort(p, port) {
				errs = append(errs, fmt.Errorf("%s: container %s: %s names port %q, which it does not declare", p.owner, c.Name, what, port))
			}
		}
	}
	return errs
}

func servicePorts(svc *corev1.Service, pods []podSpec) []error {
	var errs []error
	var matched []podSpec
	for _, p := range pods {
		if len(svc.Spec.Selector) > 0 && labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(p.tmpl.Labels)) {
			matched = append(matched, p)
		}
	}
	if len(matched) == 0 {
		return []error{fmt.Errorf("Service %s selects no pod of these manifests", svc.Name)}
	}
	for _, port := range svc.Spec.Ports {
		if name := port.TargetPort.StrVal; name != "" {
			for _, p := range matched {
				if !hasPort(p, name) {
					errs = append(errs, fmt.Errorf("Service %s: targetPort %q is no port of %s", svc.Name, name, p.owner))
				}
			}
		}
	}
	return errs
}

func monitorPorts(m *monitoringv1.ServiceMonitor, services map[string]*corev1.Service) []error {
	var errs []error
	var matched []*corev1.Service
	for _, s := range services {
		if len(m.Spec.Selector.MatchLabels) > 0 && labels.SelectorFromSet(m.Spec.Selector.MatchLabels).Matches(labels.Set(s.Labels)) {
			matched = append(matched, s)
		}
	}
	if len(matched) == 0 {
		return []error{fmt.Errorf("ServiceMonitor %s selects no Service of these manifests", m.Name)}
	}
	for _, ep := range m.Spec.Endpoints {
		for _, s := range matched {
			found := false
			for _, p := range s.Spec.Ports {
				found = found || p.Name == ep.Port
			}
			if !found {
				errs = append(errs, fmt.Errorf("ServiceMonitor %s: port %q is no port of Service %s", m.Name, ep.Port, s.Name))
			}
		}
	}
	return errs
}
