// The e2e flow drives the binaries over the API, never appliance in-process
// nor the store.
package e2e

import (
	_ "kiln/appliance"
	_ "kiln/store"
)
