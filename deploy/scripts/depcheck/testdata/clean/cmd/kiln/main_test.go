package main

import (
	_ "kiln/store/storetest"
)
