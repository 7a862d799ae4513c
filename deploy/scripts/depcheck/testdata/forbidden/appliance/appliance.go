// appliance may not import deploy outside its tests.
package appliance

import (
	_ "kiln/deploy/lab/testkit"
)
