package api_test

import (
	_ "kiln/api"
	_ "kiln/deploy/lab/testkit"
	_ "kiln/store/storetest"
)
