package storetest

import (
	_ "kiln/store"
)
