package intake

import (
	_ "kiln/appliance/lifecycle/rules"
	_ "kiln/store"
)
