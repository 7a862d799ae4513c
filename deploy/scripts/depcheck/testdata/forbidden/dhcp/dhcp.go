// A protocol package importing the store.
package dhcp

import (
	_ "kiln/store"
)
