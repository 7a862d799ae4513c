package dhcp

import (
	_ "net/netip"
)
