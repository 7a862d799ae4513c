// api may import the domain (appliance/lifecycle/...), not the wiring.
package api

import (
	_ "kiln/appliance"
	_ "kiln/store"
)
