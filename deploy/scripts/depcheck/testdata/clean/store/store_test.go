package store_test

import (
	_ "kiln/store"
	_ "kiln/store/storetest"
)
