package appliance

import (
	_ "kiln/api"
	_ "kiln/appliance/lifecycle"
	_ "kiln/bmc"
	_ "kiln/dhcp"
	_ "kiln/httpboot"
	_ "kiln/store"
	_ "kiln/tftp"
)
