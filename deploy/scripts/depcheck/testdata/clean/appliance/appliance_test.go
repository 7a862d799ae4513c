package appliance

import (
	_ "kiln/deploy/lab/testkit"
	_ "kiln/store/storetest"
)
