package agent

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"sort"
	"strings"

	"golang.org/x/crypto/ssh"

	"kiln/api/agentapi"
)

// NoCloud seed (cloud-init docs, "NoCloud" datasource): a volume labelled CIDATA holding
// user-data, meta-data and network-config. Our part of user-data is a #cloud-config with:
//   - ssh_keys.ed25519_private/ed25519_public: the host key generated here for this node
//     (cloud-init's ssh module installs it instead of generating one);
//   - ssh_authorized_keys: StageData.SSHKeys;
//   - ca_certs.trusted: StageData.CABundle;
//   - write_files: /etc/kiln/join.yaml (0600, JoinData), /etc/kiln/labels.json, /etc/kiln/ca.pem.
// When StageData.UserData is set it follows as a second part of a multipart/mixed message
// (cloud-init merges the parts in order), so the operator's user-data is kept verbatim.
// Scalars are emitted as JSON strings, which are valid YAML double-quoted scalars.

// HostKey is a generated SSH host key pair in OpenSSH formats.
type HostKey struct {
	PrivatePEM string // "-----BEGIN OPENSSH PRIVATE KEY-----..."
	Public     string // "ssh-ed25519 AAAA... host@NAME"
}

// NewHostKey generates an ed25519 host key.
func NewHostKey(comment string) (HostKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return HostKey{}, err
	}
	blk, err := ssh.MarshalPrivateKey(priv, comment)
	if err != nil {
		return HostKey{}, err
	}
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		return HostKey{}, err
	}
	pubLine := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp))) + " " + comment
	return HostKey{PrivatePEM: string(pem.EncodeToMemory(blk)), Public: pubLine}, nil
}

func q(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// SeedFiles renders the cidata files for st with host key hk.
func SeedFiles(st *agentapi.StageData, hk HostKey) ([]FATFile, error) {
	if st == nil || st.InstanceID == "" || st.Hostname == "" {
		return nil, fmt.Errorf("%w: stage data needs instance_id and hostname", ErrBadTask)
	}
	var cc strings.Builder
	cc.WriteString("#cloud-config\n")
	fmt.Fprintf(&cc, "hostname: %s\n", q(st.Hostname))
	fmt.Fprintf(&cc, "fqdn: %s\n", q(st.Hostname))
	cc.WriteString("ssh_deletekeys: true\nssh_genkeytypes: []\nssh_keys:\n")
	fmt.Fprintf(&cc, "  ed25519_private: %s\n", q(hk.PrivatePEM))
	fmt.Fprintf(&cc, "  ed25519_public: %s\n", q(hk.Public))
	if len(st.SSHKeys) > 0 {
		cc.WriteString("ssh_authorized_keys:\n")
		for _, k := range st.SSHKeys {
			fmt.Fprintf(&cc, "  - %s\n", q(k))
		}
	}
	if st.CABundle != "" {
		fmt.Fprintf(&cc, "ca_certs:\n  trusted:\n    - %s\n", q(st.CABundle))
	}
	var wf []string
	if st.JoinData != "" {
		wf = append(wf, fmt.Sprintf("  - path: /etc/kiln/join.yaml\n    permissions: \"0600\"\n    content: %s\n", q(st.JoinData)))
	}
	if st.CABundle != "" {
		wf = append(wf, fmt.Sprintf("  - path: /etc/kiln/ca.pem\n    permissions: \"0644\"\n    content: %s\n", q(st.CABundle)))
	}
	if len(st.Labels) > 0 {
		keys := make([]string, 0, len(st.Labels))
		for k := range st.Labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		ordered := make([]string, 0, len(keys))
		for _, k := range keys {
			ordered = append(ordered, q(k)+":"+q(st.Labels[k]))
		}
		wf = append(wf, fmt.Sprintf("  - path: /etc/kiln/labels.json\n    permissions: \"0644\"\n    content: %s\n", q("{"+strings.Join(ordered, ",")+"}\n")))
	}
	if len(wf) > 0 {
		cc.WriteString("write_files:\n" + strings.Join(wf, ""))
	}
	userData := cc.String()
	if st.UserData != "" {
		const b = "KILN-BOUNDARY-7f3a"
		userData = "Content-Type: multipart/mixed; boundary=\"" + b + "\"\nMIME-Version: 1.0\n\n" +
			"--" + b + "\nContent-Type: text/cloud-config; charset=\"utf-8\"\nContent-Disposition: attachment; filename=\"kiln.cfg\"\n\n" +
			cc.String() + "\n--" + b + "\nContent-Type: " + userDataType(st.UserData) +
			"; charset=\"utf-8\"\nContent-Disposition: attachment; filename=\"user-data\"\n\n" +
			st.UserData + "\n--" + b + "--\n"
	}
	meta := fmt.Sprintf("instance-id: %s\nlocal-hostname: %s\n", q(st.InstanceID), q(st.Hostname))
	netcfg := st.NetworkConfig
	if netcfg == "" {
		netcfg = "version: 2\nethernets:\n  all:\n    match:\n      name: \"e*\"\n    dhcp4: true\n"
	}
	return []FATFile{
		{Name: "meta-data", Data: []byte(meta)},
		{Name: "user-data", Data: []byte(userData)},
		{Name: "network-config", Data: []byte(netcfg)},
	}, nil
}

// userDataType maps the first line of user-data to its cloud-init MIME type.
func userDataType(ud string) string {
	switch {
	case strings.HasPrefix(ud, "#cloud-config"):
		return "text/cloud-config"
	case strings.HasPrefix(ud, "#!"):
		return "text/x-shellscript"
	case strings.HasPrefix(ud, "#cloud-boothook"):
		return "text/cloud-boothook"
	}
	return "text/plain"
}
