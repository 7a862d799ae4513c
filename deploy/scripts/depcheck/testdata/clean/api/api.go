package api

import (
	_ "kiln/appliance/lifecycle"
	_ "kiln/appliance/lifecycle/intake"
	_ "kiln/store"
)
