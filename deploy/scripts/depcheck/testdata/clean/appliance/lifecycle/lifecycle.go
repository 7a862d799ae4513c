package lifecycle

import (
	_ "kiln/api/agentapi"
	_ "kiln/appliance/lifecycle/rules"
	_ "kiln/store"
)
