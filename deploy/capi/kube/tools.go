//go:build tools

// Package kube pins the commands deploy/capi/kube/build.sh builds.
package kube

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
