// A lab package that reaches the store carries the test there.
package bmc_test

import (
	_ "kiln/deploy/lab/e2e"
)
