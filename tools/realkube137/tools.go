//go:build tools

// Package realkube pins the real Kubernetes control plane the tests of tests/kube/ and
// tests/deploy/ run against: build.sh builds these main packages (never this file).
package realkube

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "sigs.k8s.io/kustomize/kustomize/v5"
)
