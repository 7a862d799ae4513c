// A protocol package's test may use the lab's test helpers.
package dhcp

import (
	_ "kiln/deploy/lab/testkit"
)
