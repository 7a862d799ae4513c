// A protocol package's test importing the store.
package tftp

import (
	_ "kiln/store"
)
