// kiln-agent: see main.go. Packages: agent (protocol and gated build), inventory (sysfs).
// The environment that boots it is built by deploy/env/build.sh (`make env`).
package main
