// A file this build ignores (another GOOS) is checked too.
package httpboot

import (
	_ "kiln/store"
)
